//! TODO(failpoint): being written.
