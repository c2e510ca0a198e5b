//! The simulation's clocks: [`tessera_sim::clock`].

pub use tessera_sim::clock::{monotonic_ns, realtime_us};
