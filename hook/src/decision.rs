//! What `prestart` does for a container — ignore, refuse, bind or inject —
//! as one pure function of what the container asks, the hook's settings and
//! what the spec says.
//!
//! The spec is read only when the decision needs it: [`decide`] first
//! answers [`Decision::ReadSpec`] naming the spec, and the caller asks again
//! with what reading it found. So a request that is ignored never has a spec
//! read, and the whole matrix is tested as a table, without files or root.
//!
//! | request | setting | spec | decision |
//! |---|---|---|---|
//! | allocation, from an annotation | any | missing | refuse |
//! | allocation, from env only | any | missing | ignore (warn) |
//! | allocation, any source | any | applied by the runtime | bind |
//! | allocation, from an annotation | any | not applied | inject and bind |
//! | allocation, from env only | any | not applied | ignore (warn) |
//! | `NVIDIA_VISIBLE_DEVICES` | off | — | ignore (info) |
//! | `NVIDIA_VISIBLE_DEVICES` malformed | on | — | refuse |
//! | `NVIDIA_VISIBLE_DEVICES` `void`/`none`/empty | on | — | nothing |
//! | `NVIDIA_VISIBLE_DEVICES` | on | missing | refuse |
//! | `NVIDIA_VISIBLE_DEVICES` | on | applied | already applied |
//! | `NVIDIA_VISIBLE_DEVICES` | on | not applied | inject |
//!
//! Env alone never requests devices: any image can set an env variable.
//!
//! A container that asks for nothing (no allocation, no
//! `NVIDIA_VISIBLE_DEVICES`) never gets here: it takes the fast path, or —
//! when the runtime applied the static spec through CDI and its library
//! mounts are in `config.json` — only has those libraries registered
//! (`commands::static_libraries`); nothing is bound or injected for it.

use std::path::Path;

use tessera_model::alloc::AllocId;
use tessera_model::contract::cdi::STATIC_SPEC_FILE;
use tessera_model::contract::env::{ALLOC_ID as ALLOC_ID_ENV, VISIBLE_DEVICES};

use crate::log::Level;
use crate::request::{Request, VisibleDevices, parse_visible_devices};

/// The spec a request needs read before it can be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecRef {
    /// The allocation's transient spec.
    Alloc(AllocId),
    /// The static spec, resolved for these devices.
    Static(VisibleDevices),
}

/// What reading the spec found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFound {
    /// No such spec (or no spec directory).
    Missing,
    /// The spec; `applied` when its edits are already in `config.json` (the
    /// runtime applied them).
    Present {
        /// The runtime applied the edits.
        applied: bool,
    },
}

/// Everything the decision rests on.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// What the container asks for.
    pub request: &'a Request,
    /// `accept_nvidia_visible_devices` from `hook.toml`.
    pub accept_nvidia_visible_devices: bool,
    /// `cdi_dir` from `hook.toml`, for messages.
    pub cdi_dir: &'a Path,
    /// What reading the spec found; `None` until it was read.
    pub spec: Option<SpecFound>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing asked after all (`NVIDIA_VISIBLE_DEVICES=void`).
    Nothing,
    /// Read this spec, then decide again with what was found.
    ReadSpec(SpecRef),
    /// Leave the container alone, saying why at `level`.
    Ignore {
        /// Why.
        why: String,
        /// How loudly.
        level: Level,
    },
    /// Fail the container (exit 4).
    Refuse(String),
    /// The runtime applied the static spec; nothing to record.
    AlreadyApplied,
    /// The runtime applied the allocation's spec: record the binding.
    Bind(AllocId),
    /// Apply the edits; with an allocation, record the binding too.
    Inject(Option<AllocId>),
}

/// Decides what `prestart` does (see the module's table).
pub fn decide(inputs: &Inputs<'_>) -> Decision {
    let cdi_dir = inputs.cdi_dir.display();
    if let Some(alloc) = &inputs.request.alloc {
        let id = &alloc.id;
        return match (inputs.spec, alloc.source.may_inject()) {
            (None, _) => Decision::ReadSpec(SpecRef::Alloc(id.clone())),
            (Some(SpecFound::Missing), false) => Decision::Ignore {
                why: format!(
                    "env {ALLOC_ID_ENV}={id} names no allocation spec in {cdi_dir}; ignored (env alone never requests devices)"
                ),
                level: Level::Warn,
            },
            (Some(SpecFound::Missing), true) => Decision::Refuse(format!(
                "allocation {id} ({}): no transient spec {} in {cdi_dir}",
                alloc.source,
                id.spec_file_name()
            )),
            (Some(SpecFound::Present { applied: true }), _) => Decision::Bind(id.clone()),
            (Some(SpecFound::Present { applied: false }), false) => Decision::Ignore {
                why: format!(
                    "env {ALLOC_ID_ENV}={id} but the allocation's devices are not in config.json; ignored (env alone never requests injection; use the tessera.io/alloc-id annotation)"
                ),
                level: Level::Warn,
            },
            (Some(SpecFound::Present { applied: false }), true) => {
                Decision::Inject(Some(id.clone()))
            }
        };
    }
    let Some(raw) = &inputs.request.visible_devices else {
        return Decision::Nothing;
    };
    if !inputs.accept_nvidia_visible_devices {
        return Decision::Ignore {
            why: format!(
                "{VISIBLE_DEVICES} ignored: accept_nvidia_visible_devices is off in hook.toml"
            ),
            level: Level::Info,
        };
    }
    let wanted = match parse_visible_devices(raw) {
        Err(why) => return Decision::Refuse(why),
        Ok(None) => return Decision::Nothing,
        Ok(Some(wanted)) => wanted,
    };
    match inputs.spec {
        None => Decision::ReadSpec(SpecRef::Static(wanted)),
        Some(SpecFound::Missing) => Decision::Refuse(format!(
            "{VISIBLE_DEVICES} asks for GPUs but there is no static spec {STATIC_SPEC_FILE} in the CDI directory (run `tessera-cdi generate`)"
        )),
        Some(SpecFound::Present { applied: true }) => Decision::AlreadyApplied,
        Some(SpecFound::Present { applied: false }) => Decision::Inject(None),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::request::parse_request;

    const ID: &str = "pod-0";

    /// The request of a container with these annotations and env entries.
    fn request(annotations: &[(&str, &str)], env: &[&str]) -> Request {
        let annotations: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let env: Vec<String> = env.iter().map(|e| (*e).to_owned()).collect();
        parse_request(&annotations, &env).expect("a valid request")
    }

    fn annotated() -> Request {
        request(&[("tessera.io/alloc-id", ID)], &[])
    }

    fn cdi_annotated() -> Request {
        request(
            &[("cdi.k8s.io/tessera_pod-0", "tessera.io/alloc=pod-0")],
            &[],
        )
    }

    fn env_only() -> Request {
        request(&[], &["TESSERA_ALLOC_ID=pod-0"])
    }

    fn visible(value: &str) -> Request {
        Request {
            alloc: None,
            visible_devices: Some(value.to_owned()),
        }
    }

    fn id() -> AllocId {
        AllocId::new(ID).expect("id")
    }

    const MISSING: Option<SpecFound> = Some(SpecFound::Missing);
    const APPLIED: Option<SpecFound> = Some(SpecFound::Present { applied: true });
    const NOT_APPLIED: Option<SpecFound> = Some(SpecFound::Present { applied: false });

    /// What a row expects: a decision, or a refusal or ignore whose text holds a part.
    #[derive(Debug)]
    enum Expect {
        Is(Decision),
        Refused(&'static str),
        Ignored(Level, &'static str),
    }

    #[test]
    fn every_row_of_the_decision_matrix() {
        use Expect::{Ignored, Is, Refused};
        let named =
            |names: &[&str]| VisibleDevices::Named(names.iter().map(|n| (*n).to_owned()).collect());
        #[rustfmt::skip]
        let rows: Vec<(&str, Request, bool, Option<SpecFound>, Expect)> = vec![
            // An allocation: its spec is read first, whatever the setting.
            ("annotation, spec not read", annotated(), false, None, Is(Decision::ReadSpec(SpecRef::Alloc(id())))),
            ("env, spec not read", env_only(), true, None, Is(Decision::ReadSpec(SpecRef::Alloc(id())))),
            ("annotation, no spec", annotated(), false, MISSING, Refused("allocation pod-0 (annotation tessera.io/alloc-id): no transient spec tessera.io-alloc_pod-0.json in /cdi")),
            ("cdi annotation, no spec", cdi_annotated(), false, MISSING, Refused("allocation pod-0 (a cdi.k8s.io/ annotation): no transient spec")),
            ("env, no spec", env_only(), false, MISSING, Ignored(Level::Warn, "env TESSERA_ALLOC_ID=pod-0 names no allocation spec in /cdi")),
            ("annotation, applied", annotated(), false, APPLIED, Is(Decision::Bind(id()))),
            ("env, applied", env_only(), false, APPLIED, Is(Decision::Bind(id()))),
            ("annotation, not applied", annotated(), false, NOT_APPLIED, Is(Decision::Inject(Some(id())))),
            ("cdi annotation, not applied", cdi_annotated(), true, NOT_APPLIED, Is(Decision::Inject(Some(id())))),
            ("env, not applied", env_only(), true, NOT_APPLIED, Ignored(Level::Warn, "env alone never requests injection")),
            // NVIDIA_VISIBLE_DEVICES: only where hook.toml allows it.
            ("visible devices, off", visible("0"), false, None, Ignored(Level::Info, "accept_nvidia_visible_devices is off")),
            ("visible devices, off, spec there", visible("all"), false, APPLIED, Ignored(Level::Info, "NVIDIA_VISIBLE_DEVICES ignored")),
            ("visible devices malformed", visible("0,,1"), true, None, Refused("NVIDIA_VISIBLE_DEVICES: entry \"\"")),
            ("visible devices void", visible("void"), true, None, Is(Decision::Nothing)),
            ("visible devices, spec not read", visible("1,GPU-aa"), true, None, Is(Decision::ReadSpec(SpecRef::Static(named(&["1", "GPU-aa"]))))),
            ("visible devices all, spec not read", visible("all"), true, None, Is(Decision::ReadSpec(SpecRef::Static(VisibleDevices::All)))),
            ("visible devices, no static spec", visible("0"), true, MISSING, Refused("no static spec tessera.io-gpu.json")),
            ("visible devices, applied", visible("0"), true, APPLIED, Is(Decision::AlreadyApplied)),
            ("visible devices, not applied", visible("0"), true, NOT_APPLIED, Is(Decision::Inject(None))),
            // An allocation wins over NVIDIA_VISIBLE_DEVICES.
            ("allocation and visible devices", request(&[("tessera.io/alloc-id", ID)], &["NVIDIA_VISIBLE_DEVICES=0"]), true, NOT_APPLIED, Is(Decision::Inject(Some(id())))),
            // Nothing asked.
            ("nothing", Request::default(), true, None, Is(Decision::Nothing)),
        ];
        for (row, request, accept, spec, expect) in rows {
            let got = decide(&Inputs {
                request: &request,
                accept_nvidia_visible_devices: accept,
                cdi_dir: Path::new("/cdi"),
                spec,
            });
            match (&expect, &got) {
                (Is(want), got) => assert_eq!(got, want, "row {row:?}"),
                (Refused(part), Decision::Refuse(why)) => {
                    assert!(why.contains(part), "row {row:?}: {why:?} lacks {part:?}");
                }
                (Ignored(level, part), Decision::Ignore { why, level: got }) => {
                    assert_eq!(got, level, "row {row:?}");
                    assert!(why.contains(part), "row {row:?}: {why:?} lacks {part:?}");
                }
                (expect, got) => panic!("row {row:?}: expected {expect:?}, decided {got:?}"),
            }
        }
    }

    #[test]
    fn every_message_is_one_line() {
        for (request, spec) in [
            (annotated(), MISSING),
            (env_only(), MISSING),
            (env_only(), NOT_APPLIED),
            (visible("0"), MISSING),
            (visible("a b"), None),
        ] {
            let got = decide(&Inputs {
                request: &request,
                accept_nvidia_visible_devices: true,
                cdi_dir: Path::new("/var/run/cdi"),
                spec,
            });
            let text = match got {
                Decision::Refuse(why) | Decision::Ignore { why, .. } => why,
                other => panic!("{other:?} carries no message"),
            };
            assert!(!text.contains('\n'), "{text:?}");
        }
    }
}
