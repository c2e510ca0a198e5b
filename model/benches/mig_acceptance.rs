//! MIG acceptance under random arrival and departure: the placement policies
//! (FirstFit, MostRoom, LeastStranded — the fit's) against an offline optimum
//! and against the best online policy.
//!
//! Each trial is a random sequence of arrivals (a profile each) and
//! departures on one empty GPU, the jump chain of a loss system: requests
//! arrive at rate λ and each lives an exponential time of mean 1 **whether or
//! not it was admitted** (a rejected request simply never occupied a slot), so
//! with `n` requests alive the next event is an arrival with probability
//! λ / (λ + n), else a uniformly chosen live request leaves. The future is thus
//! fixed in advance, the same for every policy and for the optimum. Profiles
//! arrive weighted towards small ones (weight: axis slots over the profile's
//! memory slices); λ is set per model so the offered load — λ × mean slots per
//! request over the axis length — is each of [`LOADS`].
//!
//! The online policies place each arrival as it comes (or reject it when no
//! legal placement is free). Two offline optima see the whole sequence and
//! search every choice exhaustively:
//! - `optimum`: every placement choice, with the scheduler's admission rule
//!   (an arrival that can be placed is placed) — the best any placement
//!   policy could do, the goal's yardstick;
//! - `admission`: also free to reject an arrival that could be placed, to
//!   keep room for later ones — an upper bound no online scheduler that
//!   admits what fits can reach.
//!
//! A third yardstick, `online-opt`, is the best **online** policy for the
//! workload: the exact solution of the Markov decision process over (events
//! left, occupancy, rejected requests still alive). It knows the arrival mix,
//! the load and the horizon, which no scheduler does, and it still falls short
//! of the offline optimum: on the 8-slot models it accepts ≈ 95–97.5 % of it,
//! so no online placement policy reaches 99 % of the offline optimum there.
//!
//! Each policy judges room over the allowlisted (plain) profiles, as the fit
//! does. Each row gives accepted arrivals summed over the trials, then each
//! online policy as % of the optimum and as % of `online-opt`.
//!
//! `cargo bench -p tessera-model --bench mig_acceptance` (release; about 35 s
//! of CPU). `cargo test -p tessera-model --benches` runs a few trials as a
//! smoke test.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tessera_model::mig::catalogue::{self, GiProfileSpec};
use tessera_model::mig::placement::{Occupancy, Placement, PlacementPolicy, choose};

const SEED: u64 = 0x5eed_a11c;
/// Offered loads: requested slots per unit time (each request living 1 time
/// unit on average) over the axis length.
const LOADS: &[f64] = &[0.5, 1.0, 2.0];
/// Trials per model and load in a full run, and events per trial.
const TRIALS: usize = 1000;
const EVENTS: usize = 24;
/// Models compared (their plain profiles: the default allowlist).
const MODELS: &[&str] = &["A100-40GB", "H100-80GB", "A30", "RTX-PRO-6000"];

/// A multiply-rotate hasher for the searches' small integer keys (the
/// default SipHash dominates their run time).
#[derive(Default)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // The splitmix64 finalizer, so every input bit reaches the low bits.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A way to place an arrival: the placement, or `None` to reject it.
type Policy = fn(&Occupancy, &GiProfileSpec, &[&GiProfileSpec]) -> Option<Placement>;

/// The policies compared, by name.
const POLICIES: &[(&str, Policy)] = &[
    ("first-fit", |o, t, ps| {
        choose(o, t, ps, PlacementPolicy::FirstFit)
    }),
    ("most-room", |o, t, ps| {
        choose(o, t, ps, PlacementPolicy::MostRoom)
    }),
    ("least-strand", |o, t, ps| {
        choose(o, t, ps, PlacementPolicy::LeastStranded)
    }),
];

#[derive(Debug, Clone, Copy)]
enum Event {
    /// Request `id` asks for profile index `profile`.
    Arrive { id: usize, profile: usize },
    /// Request `id` leaves (nothing when it was rejected).
    Depart { id: usize },
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (`cargo test --benches`) is a smoke run.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let trials = if smoke { 3 } else { TRIALS };
    println!(
        "MIG acceptance: {trials} trials × {EVENTS} events per model and load, seed {SEED:#x}. \
         Per row: accepted arrivals summed; then each online policy as % of the optimum; \
         then as % of online-opt (the best online policy for the workload)."
    );
    print!(
        "{:<14} {:>4} {:>7} {:>9} {:>9}",
        "model", "load", "", "optimum", "admission"
    );
    for (name, _) in POLICIES {
        print!(" {name:>12}");
    }
    println!(" {:>12}", "online-opt");
    let mut all = vec![0usize; POLICIES.len() + 3];
    for (load_index, &load) in LOADS.iter().enumerate() {
        let mut all_at_load = vec![0usize; POLICIES.len() + 3];
        for (model_index, key) in MODELS.iter().enumerate() {
            let sums = compare(
                key,
                load,
                trials,
                (load_index * MODELS.len() + model_index) as u64,
            );
            print_row(key, Some(load), &sums);
            for (total, sum) in all_at_load.iter_mut().zip(&sums) {
                *total += sum;
            }
        }
        print_row("all", Some(load), &all_at_load);
        for (total, sum) in all.iter_mut().zip(&all_at_load) {
            *total += sum;
        }
    }
    print_row("all", None, &all);
}

/// Sums over `trials` on one model at one load: optimum, admission bound,
/// each of [`POLICIES`], online-opt.
fn compare(key: &str, load: f64, trials: usize, stream: u64) -> Vec<usize> {
    let spec = catalogue::find(key)
        .and_then(|m| m.mig)
        .unwrap_or_else(|| panic!("{key} is a MIG model of the catalogue"));
    let profiles: Vec<&GiProfileSpec> = spec
        .profiles
        .iter()
        .filter(|p| !p.name.contains(['+', '-']))
        .collect();
    // One stream per model and load, so no row depends on another.
    let mut rng = SmallRng::seed_from_u64(SEED ^ stream);
    let mut sums = vec![0usize; POLICIES.len() + 3];
    let mut ceiling = OnlineOptimum::new(&profiles, spec.axis_len, load, EVENTS);
    for _ in 0..trials {
        let events = random_events(&mut rng, &profiles, spec.axis_len, load, EVENTS);
        let best = optimum(&events, &profiles, spec.axis_len, false);
        let bound = optimum(&events, &profiles, spec.axis_len, true);
        assert!(best <= bound, "rejecting is one more choice");
        sums[0] += best;
        sums[1] += bound;
        for (slot, (name, policy)) in POLICIES.iter().enumerate() {
            let accepted = online(&events, &profiles, spec.axis_len, *policy);
            assert!(accepted <= best, "{name}: the optimum is an upper bound");
            sums[slot + 2] += accepted;
        }
        let best_online = ceiling.run(&events);
        assert!(
            best_online <= best,
            "online-opt: the optimum is an upper bound"
        );
        sums[POLICIES.len() + 2] += best_online;
    }
    sums
}

fn print_row(name: &str, load: Option<f64>, sums: &[usize]) {
    let load = load.map_or(String::new(), |l| format!("{l:.1}"));
    print!(
        "{name:<14} {load:>4} {:>7} {:>9} {:>9}",
        "count", sums[0], sums[1]
    );
    for &sum in &sums[2..] {
        print!(" {sum:>12}");
    }
    println!();
    let online_opt = sums[sums.len() - 1];
    for (label, of) in [("% opt", sums[0]), ("% online", online_opt)] {
        print!("{:<14} {:>4} {label:>7} {:>9} {:>9}", "", "", "", "");
        for &sum in &sums[2..] {
            print!(" {:>11.2}%", 100.0 * sum as f64 / of.max(1) as f64);
        }
        println!();
    }
}

/// Arrival weights by profile, and the arrival rate giving an offered load.
struct Workload {
    weights: Vec<u32>,
    total: u32,
    arrival_rate: f64,
}

impl Workload {
    fn new(profiles: &[&GiProfileSpec], axis_len: u32, load: f64) -> Self {
        let weights: Vec<u32> = profiles
            .iter()
            .map(|p| (axis_len / p.memory_slices).max(1))
            .collect();
        let total: u32 = weights.iter().sum();
        let mean_slots = profiles
            .iter()
            .zip(&weights)
            .map(|(p, &w)| f64::from(p.memory_slices * w))
            .sum::<f64>()
            / f64::from(total);
        Workload {
            weights,
            total,
            arrival_rate: load * f64::from(axis_len) / mean_slots,
        }
    }
}

/// The loss system's jump chain (see the module doc) at offered `load`.
fn random_events(
    rng: &mut SmallRng,
    profiles: &[&GiProfileSpec],
    axis_len: u32,
    load: f64,
    count: usize,
) -> Vec<Event> {
    let Workload {
        weights,
        total,
        arrival_rate,
    } = Workload::new(profiles, axis_len, load);
    let mut alive: Vec<usize> = Vec::new();
    let mut next_id = 0;
    let mut events = Vec::with_capacity(count);
    while events.len() < count {
        let rate = arrival_rate + alive.len() as f64;
        if rng.random::<f64>() * rate >= arrival_rate {
            let id = alive.swap_remove(rng.random_range(0..alive.len()));
            events.push(Event::Depart { id });
        } else {
            let mut pick = rng.random_range(0..total);
            let mut profile = 0;
            while pick >= weights[profile] {
                pick -= weights[profile];
                profile += 1;
            }
            events.push(Event::Arrive {
                id: next_id,
                profile,
            });
            alive.push(next_id);
            next_id += 1;
        }
    }
    events
}

/// The best online policy for this very workload: a Markov decision process
/// over (events left, GPU occupancy, rejected requests still alive), solved
/// exactly. It knows the arrival mix, the load and the horizon — no scheduler
/// does — so it is the ceiling for any online policy. Per-profile instance
/// limits are left out of the state: on the catalogue's plain profiles they
/// equal the number of disjoint placements, so they never bind.
struct OnlineOptimum<'a> {
    profiles: &'a [&'a GiProfileSpec],
    workload: Workload,
    events: usize,
    memo: FastMap<(usize, u32, u64, u64), f64>,
}

impl<'a> OnlineOptimum<'a> {
    fn new(profiles: &'a [&'a GiProfileSpec], axis_len: u32, load: f64, events: usize) -> Self {
        OnlineOptimum {
            profiles,
            workload: Workload::new(profiles, axis_len, load),
            events,
            memo: FastMap::default(),
        }
    }

    /// Expected arrivals accepted from event `at` on.
    fn value(&mut self, at: usize, occ: Occupancy, ghosts: u32) -> f64 {
        if at >= self.events {
            return 0.0;
        }
        let key = (at, ghosts, occ.used_mask(), starts_mask(&occ));
        if let Some(&v) = self.memo.get(&key) {
            return v;
        }
        let live: Vec<Placement> = occ.instances().collect();
        let rate = self.workload.arrival_rate + live.len() as f64 + f64::from(ghosts);
        let mut v = 0.0;
        let profiles = self.profiles;
        let weights = self.workload.weights.clone();
        for (profile, &w) in profiles.iter().zip(&weights) {
            let p =
                self.workload.arrival_rate / rate * f64::from(w) / f64::from(self.workload.total);
            let best = self.best(at, occ, ghosts, profile);
            v += p * match best {
                Some((value, _)) => 1.0 + value,
                None => self.value(at + 1, occ, ghosts + 1),
            };
        }
        for placement in live {
            let mut after = occ;
            after.release(placement).expect("live instance");
            v += self.value(at + 1, after, ghosts) / rate;
        }
        if ghosts > 0 {
            v += f64::from(ghosts) / rate * self.value(at + 1, occ, ghosts - 1);
        }
        self.memo.insert(key, v);
        v
    }

    /// The placement of an arrival at event `at` that leaves the most
    /// expected acceptances, with that expectation.
    fn best(
        &mut self,
        at: usize,
        occ: Occupancy,
        ghosts: u32,
        profile: &GiProfileSpec,
    ) -> Option<(f64, Placement)> {
        let mut best: Option<(f64, Placement)> = None;
        for placement in profile.placements().filter(|&l| occ.is_free(l)) {
            let mut after = occ;
            after.occupy(placement).expect("free");
            let value = self.value(at + 1, after, ghosts);
            if best.is_none_or(|(b, _)| value > b + 1e-12) {
                best = Some((value, placement));
            }
        }
        best
    }

    /// Accepted arrivals of `events` under the policy.
    fn run(&mut self, events: &[Event]) -> usize {
        let mut occ = Occupancy::new(self.workload_axis()).expect("valid axis");
        let mut live: HashMap<usize, Placement> = HashMap::new();
        let mut ghosts: HashMap<usize, ()> = HashMap::new();
        let mut accepted = 0;
        for (at, event) in events.iter().enumerate() {
            match *event {
                Event::Arrive { id, profile } => {
                    let g = ghosts.len() as u32;
                    match self.best(at, occ, g, self.profiles[profile]) {
                        Some((_, placement)) => {
                            occ.occupy(placement).expect("free");
                            live.insert(id, placement);
                            accepted += 1;
                        }
                        None => {
                            ghosts.insert(id, ());
                        }
                    }
                }
                Event::Depart { id } => {
                    if let Some(placement) = live.remove(&id) {
                        occ.release(placement).expect("live");
                    }
                    ghosts.remove(&id);
                }
            }
        }
        accepted
    }

    fn workload_axis(&self) -> u32 {
        self.profiles
            .iter()
            .flat_map(|p| p.placements().map(|l| l.end()))
            .max()
            .unwrap_or(1)
    }
}

/// Bit `i`: an instance starts at slot `i`.
fn starts_mask(occ: &Occupancy) -> u64 {
    occ.instances().fold(0, |m, p| m | (1 << p.start))
}

/// Accepted arrivals when each is placed by `policy` as it comes.
fn online(events: &[Event], profiles: &[&GiProfileSpec], axis_len: u32, policy: Policy) -> usize {
    let mut occ = Occupancy::new(axis_len).expect("catalogue axis is valid");
    let mut live: HashMap<usize, Placement> = HashMap::new();
    let mut per_profile = vec![0u32; profiles.len()];
    let mut profile_of: HashMap<usize, usize> = HashMap::new();
    let mut accepted = 0;
    for event in events {
        match *event {
            Event::Arrive { id, profile } => {
                if per_profile[profile] >= profiles[profile].max_instances {
                    continue;
                }
                if let Some(placement) = policy(&occ, profiles[profile], profiles) {
                    occ.place(profiles[profile], placement)
                        .expect("a policy returns a free legal placement");
                    live.insert(id, placement);
                    profile_of.insert(id, profile);
                    per_profile[profile] += 1;
                    accepted += 1;
                }
            }
            Event::Depart { id } => {
                if let Some(placement) = live.remove(&id) {
                    occ.release(placement).expect("live instance");
                    per_profile[profile_of[&id]] -= 1;
                }
            }
        }
    }
    accepted
}

/// The most arrivals any sequence of choices accepts: exhaustive search with
/// memoization on (event, live instances). `may_reject`: an arrival that can
/// be placed may still be turned away.
///
/// The live instances are packed in a `u128`, four bits per request id
/// (0: not live, else its start + 1), so at most 32 arrivals and starts
/// below 15.
fn optimum(
    events: &[Event],
    profiles: &[&GiProfileSpec],
    axis_len: u32,
    may_reject: bool,
) -> usize {
    struct Search<'a> {
        events: &'a [Event],
        profiles: &'a [&'a GiProfileSpec],
        profile_of: Vec<usize>,
        may_reject: bool,
        memo: FastMap<(usize, u128), usize>,
    }

    impl Search<'_> {
        fn run(&mut self, at: usize, occ: Occupancy, counts: &mut [u32], live: u128) -> usize {
            let Some(&event) = self.events.get(at) else {
                return 0;
            };
            if let Some(&known) = self.memo.get(&(at, live)) {
                return known;
            }
            let best = match event {
                Event::Depart { id } => {
                    let nibble = (live >> (4 * id)) & 0xf;
                    if nibble == 0 {
                        self.run(at + 1, occ, counts, live)
                    } else {
                        let profile = self.profile_of[id];
                        let placement = Placement {
                            start: nibble as u32 - 1,
                            size: self.profiles[profile].memory_slices,
                        };
                        let mut after = occ;
                        after.release(placement).expect("live instance");
                        counts[profile] -= 1;
                        let best = self.run(at + 1, after, counts, live & !(0xf << (4 * id)));
                        counts[profile] += 1;
                        best
                    }
                }
                Event::Arrive { id, profile } => {
                    let mut placed: Option<usize> = None;
                    if counts[profile] < self.profiles[profile].max_instances {
                        for placement in self.profiles[profile].placements() {
                            if occ.is_free(placement) {
                                let mut after = occ;
                                after.occupy(placement).expect("free");
                                counts[profile] += 1;
                                let with = 1 + self.run(
                                    at + 1,
                                    after,
                                    counts,
                                    live | (u128::from(placement.start + 1) << (4 * id)),
                                );
                                counts[profile] -= 1;
                                placed = Some(placed.map_or(with, |b| b.max(with)));
                            }
                        }
                    }
                    match placed {
                        // Admission rule: what can be placed is placed.
                        Some(best) if !self.may_reject => best,
                        _ => {
                            let rejected = self.run(at + 1, occ, counts, live);
                            placed.map_or(rejected, |b| b.max(rejected))
                        }
                    }
                }
            };
            self.memo.insert((at, live), best);
            best
        }
    }

    let mut profile_of = Vec::new();
    for event in events {
        if let Event::Arrive { id, profile } = *event {
            assert_eq!(id, profile_of.len(), "ids count up from 0");
            profile_of.push(profile);
        }
    }
    assert!(profile_of.len() <= 32 && axis_len < 16, "state fits a u128");
    let mut search = Search {
        events,
        profiles,
        profile_of,
        may_reject,
        memo: FastMap::default(),
    };
    search.run(
        0,
        Occupancy::new(axis_len).expect("catalogue axis is valid"),
        &mut vec![0; profiles.len()],
        0,
    )
}
