//! `Principal`: who a client token is, as the engine's book of tokens says (`qstate token add`).

use pyo3::prelude::*;

use qstate_engine_core::auth::Principal as CorePrincipal;

use crate::bridge::py_err;

/// Who a client token is: its name and scopes (`qstate token add`).
#[pyclass(module = "qstate_engine", frozen)]
pub struct Principal(pub CorePrincipal);

#[pymethods]
impl Principal {
    #[staticmethod]
    fn of(name: String, scopes: Vec<String>) -> Self {
        Principal(CorePrincipal { name, scopes: scopes.into_iter().collect() })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.0.name
    }

    #[getter]
    fn scopes(&self) -> Vec<String> {
        self.0.scopes.iter().cloned().collect()
    }

    /// Whether the token may read `job` (its `operator`; None: any of its operators).
    #[pyo3(signature = (job, operator=None))]
    fn allows(&self, job: &str, operator: Option<&str>) -> bool {
        self.0.allows(job, operator)
    }

    /// Forbidden (403) unless it may.
    #[pyo3(signature = (job, operator=None))]
    fn check(&self, py: Python<'_>, job: &str, operator: Option<&str>) -> PyResult<()> {
        self.0.check(job, operator).map_err(|f| py_err(py, &f))
    }

    /// Forbidden unless it has scope `*` (`what` needs every job).
    fn check_all(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        self.0.check_all(what).map_err(|f| py_err(py, &f))
    }

    /// How it travels from the native front to the app: `name scope,scope`.
    fn header(&self) -> String {
        self.0.header()
    }

    fn __repr__(&self) -> String {
        format!("Principal({:?}, {:?})", self.0.name, self.0.scopes)
    }
}
