//! What is known of one hold while it lives: its validity, its fence, whether and why it was
//! lost, and the public standing a body can read.

pub(crate) mod lease_state;
pub(crate) mod status;
