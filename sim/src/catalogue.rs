//! The MIG catalogue the simulated driver follows: the model crate's data
//! (profiles, legal starts, limits). Only the data is shared; the rules that
//! apply it (overlap, GI ids) are written in [`crate::mig`].

pub(crate) use tessera_model::mig::catalogue::{
    GiProfileSpec, GpuModelSpec, MigSpec, find, models, whole_ci_profile,
};
