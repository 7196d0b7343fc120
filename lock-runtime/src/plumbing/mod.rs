//! Async building blocks with no Redis in them: request deadlines, concurrent requests decided
//! as their replies come, and the engine's tracing events and metrics.

pub(crate) mod deadlines;
pub(crate) mod fanout;
pub(crate) mod task_claim;
pub(crate) mod telemetry;
