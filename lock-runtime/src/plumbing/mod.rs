//! Async building blocks with no Redis in them: request deadlines, concurrent requests decided
//! as their replies come, the background task that serves a schedule, and the engine's tracing
//! events and metrics.

pub(crate) mod background;
pub(crate) mod deadlines;
pub(crate) mod fanout;
pub(crate) mod telemetry;
pub(crate) mod unpoisoned;
