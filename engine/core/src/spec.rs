//! What a queryable operator is (`qstate.core.records.operator.OperatorSpec`), as Python
//! pushes it: the JSON its `to_json()` writes, read here once per push.

use indexmap::IndexMap;
use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AggKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    ApproxCountDistinct,
    Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateType {
    Long,
    Double,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Aggregate {
    pub kind: AggKind,
    #[serde(rename = "type")]
    pub ty: StateType,
    #[serde(default)]
    pub lg_k: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowKind {
    Tumbling,
    Sliding,
    Session,
    None,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct WindowSpec {
    pub kind: WindowKind,
    #[serde(default)]
    pub size_ms: i64,
    #[serde(default)]
    pub slide_ms: i64,
    #[serde(default)]
    pub gap_ms: i64,
}

impl WindowSpec {
    /// The distance between window starts (a tumbling window slides by its size).
    pub fn slide(&self) -> i64 {
        if self.kind == WindowKind::Sliding {
            self.slide_ms
        } else {
            self.size_ms
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct OperatorSpec {
    pub job: String,
    pub operator: String,
    pub key: String,
    pub states: IndexMap<String, Aggregate>,
    pub partitions: u32,
    pub window: WindowSpec,
    pub retention_ms: i64,
    #[serde(default = "one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

impl OperatorSpec {
    pub fn from_json(raw: &[u8]) -> Result<Self, String> {
        let spec: OperatorSpec = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
        if spec.partitions == 0 || spec.states.is_empty() {
            return Err(format!("{}/{}: an empty spec", spec.job, spec.operator));
        }
        if spec.window.kind == WindowKind::Sliding
            && !(0 < spec.window.slide_ms && spec.window.slide_ms <= spec.window.size_ms)
        {
            return Err(format!("{}/{}: a sliding window needs 0 < slide <= size", spec.job, spec.operator));
        }
        Ok(spec)
    }

    /// Merged (count, sum, ...) or Spark-state values (`value`): one kind per operator.
    pub fn merged(&self) -> bool {
        self.states.values().next().is_some_and(|a| a.kind != AggKind::Value)
    }

    /// A merged sliding window is stored as panes; Spark-state rows are whole windows.
    pub fn panes(&self) -> bool {
        self.merged() && self.window.kind == WindowKind::Sliding
    }

    pub fn state_index(&self, state: &str) -> Option<usize> {
        self.states.get_index_of(state)
    }
}
