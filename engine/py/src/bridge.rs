//! What crosses between Python and the engine besides values: errors (a `Failure` becomes the
//! `qstate.core.errors` class it names, an `Exception`), panics (caught at every call and in
//! every task the engine runs for Python: `EngineFailed`, never pyo3's `PanicException`, a
//! `BaseException` an `except Exception` would not catch), and the answers of reads that must
//! wait, which settle an asyncio future from an engine thread (docs/architecture.md §5).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use qstate_engine_core::engine::Engine;
use qstate_engine_core::errors::{Detail, Failure};

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
static JSON_LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn errors(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    let m = ERRORS.get_or_try_init(py, || py.import("qstate.core.errors").map(Bound::unbind))?;
    Ok(m.bind(py))
}

/// The Python error `f` names: `cls(message, **detail)` (an `Unavailable` with its `reason`).
pub fn py_err(py: Python<'_>, f: &Failure) -> PyErr {
    let make = || -> PyResult<PyErr> {
        let m = errors(py)?;
        let cls = m.getattr(f.class).or_else(|_| m.getattr("QStateError"))?;
        let kw = PyDict::new(py);
        for (k, v) in &f.detail {
            match v {
                Detail::Int(x) => kw.set_item(k, x)?,
                Detail::Float(x) => kw.set_item(k, x)?,
                Detail::Str(s) => kw.set_item(k, s)?,
                Detail::Raw(j) => {
                    let loads =
                        JSON_LOADS.get_or_try_init(py, || py.import("json")?.getattr("loads").map(Bound::unbind))?;
                    kw.set_item(k, loads.bind(py).call1((j,))?)?
                }
            }
        }
        if let Some(r) = f.reason {
            kw.set_item("reason", r)?;
        }
        Ok(PyErr::from_value(cls.call((f.message.as_str(),), Some(&kw))?))
    };
    make().unwrap_or_else(|e| e)
}

/// What a panic said.
pub use qstate_engine_core::errors::panic_message;

/// The failure of a call that panicked inside the engine.
pub fn panicked(engine: Option<&Engine>, p: &(dyn Any + Send)) -> Failure {
    if let Some(e) = engine {
        e.metrics.panicked("call");
    }
    Failure::engine(format!("the router's read engine failed ({}); it goes on answering", panic_message(p)))
}

/// `f()`, a panic in it raised as `EngineFailed` (an `Exception` with a message).
pub fn guard<T>(py: Python<'_>, engine: Option<&Engine>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(py_err(py, &panicked(engine, &*p))),
    }
}

/// `fut.set_result(value)` (or `set_exception`) unless it is done (its caller went away).
#[pyfunction]
pub fn _settle(fut: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if fut.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    fut.call_method1(if ok { "set_result" } else { "set_exception" }, (value,))?;
    Ok(())
}

static SETTLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let f = wrap_pyfunction!(_settle, m)?;
    SETTLE.get_or_init(m.py(), || f.clone().into_any().unbind());
    m.add_function(f)
}

/// An asyncio future of the caller's loop, settled from an engine thread.
pub struct Later {
    pub loop_: Py<PyAny>,
    pub fut: Py<PyAny>,
}

impl Later {
    /// Settle with what `make` makes of the outcome, with the GIL.
    fn settle(self, make: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>) {
        Python::attach(|py| {
            let (ok, value) = match make(py) {
                Ok(v) => (true, v),
                Err(e) => (false, e.into_value(py).into_any()),
            };
            let Some(settle) = SETTLE.get(py) else { return };
            let args = PyTuple::new(
                py,
                [
                    settle.clone_ref(py),
                    self.fut.clone_ref(py),
                    ok.into_pyobject(py).expect("bool").to_owned().into_any().unbind(),
                    value,
                ],
            );
            if let Ok(args) = args {
                // a loop closed meanwhile: nobody waits
                let _ = self.loop_.bind(py).call_method1("call_soon_threadsafe", args);
            }
        });
    }
}

/// Run `work` on the engine's runtime; its output made into Python's by `make` settles
/// `later`. A panic in either is `EngineFailed`.
pub fn spawn<T: Send + 'static>(
    engine: &Arc<Engine>,
    later: Later,
    work: impl Future<Output = T> + Send + 'static,
    make: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
) {
    let e = engine.clone();
    engine.runtime.spawn(async move {
        let got = AssertUnwindSafe(work).catch_unwind().await;
        later.settle(move |py| match got {
            Ok(out) => match std::panic::catch_unwind(AssertUnwindSafe(|| make(py, out))) {
                Ok(r) => r,
                Err(p) => Err(py_err(py, &panicked(Some(&e), &*p))),
            },
            Err(p) => Err(py_err(py, &panicked(Some(&e), &*p))),
        });
    });
}

/// A RuntimeError for what is not a qstate error (a bad argument from Python itself).
pub fn runtime(msg: impl Into<String>) -> PyErr {
    PyRuntimeError::new_err(msg.into())
}
