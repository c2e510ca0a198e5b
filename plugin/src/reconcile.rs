//! TODO(reconcile): being written.
