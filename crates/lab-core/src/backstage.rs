//! The lab's own work, kept out of the story: setting up, reading state to show it, measuring
//! facts, cleaning up. What runs inside the span is not told (see [`crate::trace`], which reads
//! it, and the narrator, whose looks at the state run backstage too).

/// The span of the lab's own work; what runs inside is not told.
pub const BACKSTAGE_SPAN: &str = "lab.backstage";

/// Runs `work` backstage: what it executes is not told.
pub async fn backstage<F: std::future::Future>(work: F) -> F::Output {
    use tracing::Instrument as _;
    work.instrument(tracing::info_span!(BACKSTAGE_SPAN)).await
}
