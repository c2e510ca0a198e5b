//! TODO(metrics): being written.
