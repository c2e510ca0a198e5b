//! Container edits from node facts.
