//! nvml_raw
