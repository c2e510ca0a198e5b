//! TODO(health): being written.
