//! TODO(monitor): being written.
