//! Placement engine: divan timings of `choose` and `free_placements`, and,
//! before them, a seeded arrival/departure simulation comparing the policies.
//!
//! `cargo bench -p tessera-model --bench placement` runs both (100k events per
//! GPU); `cargo test -p tessera-model --benches` runs each benchmark once and a
//! short simulation, as a smoke test.

use divan::{Bencher, black_box};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tessera_model::mig::catalogue::{self, GiProfileSpec, MigSpec};
use tessera_model::mig::placement::{
    Occupancy, Placement, PlacementPolicy, choose, free_placements,
};

/// GPUs the timings run on.
const BENCH_GPUS: &[&str] = &["A100-40GB", "H100-80GB", "RTX-PRO-6000"];
/// GPUs the simulation runs on.
const SIM_GPUS: &[&str] = &["A100-40GB", "H100-80GB", "A30", "RTX-PRO-6000"];
const SEED: u64 = 0x7e55_e2a0;
/// Offered loads simulated: requested slots per unit time (arrival rate × mean
/// slots per request, each instance living 1 time unit on average) over the axis length.
const LOADS: &[f64] = &[0.5, 1.0, 2.0];
/// Arrival mix by NVML profile enum: 1g, 1g double memory, 2g, 3g, 4g, 7g.
/// Enums a GPU lacks are left out (A30 and RTX PRO 6000 have 1g/2g/4g only).
const MIX: &[(u32, u32)] = &[(0, 40), (9, 15), (1, 20), (2, 15), (3, 5), (4, 5)];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if !has("--list") {
        let benching = has("--bench") && !has("--test");
        simulate_all(if benching { 100_000 } else { 2_000 });
    }
    divan::main();
}

fn mig(key: &str) -> MigSpec {
    catalogue::find(key)
        .and_then(|m| m.mig)
        .unwrap_or_else(|| panic!("catalogue has no MIG model {key}"))
}

// ---------------------------------------------------------------- simulation
//
// A loss system: requests arrive at rate λ, each instance leaves at rate 1, a
// request that cannot be placed is lost. Simulated as its jump chain: with n
// live instances the next event is an arrival with probability λ / (λ + n),
// otherwise a uniformly chosen live instance leaves. Both policies draw the
// same random numbers, so they differ only where their choices do.

#[derive(Default)]
struct Outcome {
    arrivals: u64,
    accepted: u64,
    large_arrivals: u64,
    large_accepted: u64,
    /// ∑ used slots × expected holding time, and ∑ expected holding time.
    slot_time: f64,
    time: f64,
}

impl Outcome {
    fn acceptance(&self) -> f64 {
        percent(self.accepted, self.arrivals)
    }
    fn large_acceptance(&self) -> f64 {
        percent(self.large_accepted, self.large_arrivals)
    }
    fn mean_slots(&self) -> f64 {
        if self.time > 0.0 {
            self.slot_time / self.time
        } else {
            0.0
        }
    }
}

fn percent(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

fn run(
    spec: &MigSpec,
    mix: &[(&GiProfileSpec, u32)],
    arrival_rate: f64,
    events: usize,
    policy: PlacementPolicy,
) -> Outcome {
    let total_weight: u32 = mix.iter().map(|(_, w)| w).sum();
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut occupancy = Occupancy::new(spec.axis_len).expect("catalogue axis is valid");
    let mut live: Vec<Placement> = Vec::new();
    let mut out = Outcome::default();
    for _ in 0..events {
        // Three draws per event, whatever happens, to keep the streams aligned.
        let (kind, which, pick) = (
            rng.random::<f64>(),
            rng.random::<f64>(),
            rng.random_range(0..total_weight),
        );
        let rate = arrival_rate + live.len() as f64;
        let holding = 1.0 / rate;
        out.time += holding;
        out.slot_time += holding * f64::from(occupancy.used_slots());
        if kind * rate < arrival_rate {
            let mut pick = pick;
            let profile = mix
                .iter()
                .find(|&&(_, w)| {
                    let hit = pick < w;
                    pick = pick.saturating_sub(w);
                    hit
                })
                .map_or(mix[0].0, |&(p, _)| p);
            let large = profile.compute_slices >= 3;
            out.arrivals += 1;
            out.large_arrivals += u64::from(large);
            if let Some(placement) = choose(&occupancy, profile, spec.profiles, policy) {
                occupancy
                    .place(profile, placement)
                    .expect("choose returns a free legal placement");
                live.push(placement);
                out.accepted += 1;
                out.large_accepted += u64::from(large);
            }
        } else {
            let index = ((which * live.len() as f64) as usize).min(live.len() - 1);
            let placement = live.swap_remove(index);
            occupancy.release(placement).expect("live instance");
        }
    }
    out
}

fn simulate_all(events: usize) {
    println!();
    println!(
        "Placement policies: {events} seeded events per GPU, load and policy (seed {SEED:#x}; \
         mix 1g:1g-double:2g:3g:4g:7g = 40:15:20:15:5:5; requests arrive at rate λ, each \
         instance leaves at rate 1, a request that cannot be placed is lost; \
         load = λ × mean slots per request / axis length)"
    );
    println!();
    println!(
        "| GPU | axis | load | acceptance FirstFit | acceptance MostRoom | \
         acceptance LeastStranded | ≥3g acceptance FirstFit | ≥3g acceptance MostRoom | \
         ≥3g acceptance LeastStranded | mean slots used FirstFit | \
         mean slots used MostRoom | mean slots used LeastStranded |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for key in SIM_GPUS {
        let spec = mig(key);
        let mix: Vec<(&GiProfileSpec, u32)> = MIX
            .iter()
            .filter_map(|&(e, w)| spec.profile_by_enum(e).map(|p| (p, w)))
            .collect();
        let total_weight: u32 = mix.iter().map(|(_, w)| w).sum();
        let mean_slots_per_request = mix
            .iter()
            .map(|(p, w)| f64::from(p.memory_slices * w))
            .sum::<f64>()
            / f64::from(total_weight);
        for &load in LOADS {
            let arrival_rate = load * f64::from(spec.axis_len) / mean_slots_per_request;
            let ff = run(&spec, &mix, arrival_rate, events, PlacementPolicy::FirstFit);
            let mr = run(&spec, &mix, arrival_rate, events, PlacementPolicy::MostRoom);
            let ls = run(
                &spec,
                &mix,
                arrival_rate,
                events,
                PlacementPolicy::LeastStranded,
            );
            println!(
                "| {key} | {} | {load:.1} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% \
                 | {:.2} | {:.2} | {:.2} |",
                spec.axis_len,
                ff.acceptance(),
                mr.acceptance(),
                ls.acceptance(),
                ff.large_acceptance(),
                mr.large_acceptance(),
                ls.large_acceptance(),
                ff.mean_slots(),
                mr.mean_slots(),
                ls.mean_slots(),
            );
        }
    }
    println!();
}

// ---------------------------------------------------------------- timings

/// A GPU with one 1g instance at slice 2, and its 1g profile: `choose` weighs
/// the six other 1g starts.
fn partly_used(spec: &MigSpec) -> (Occupancy, &'static GiProfileSpec) {
    let one_g = spec.profile_by_enum(0).expect("1g profile");
    let occupancy =
        Occupancy::with(spec.axis_len, [Placement { start: 2, size: 1 }]).expect("valid");
    (occupancy, one_g)
}

fn bench_choose(bencher: Bencher, key: &str, policy: PlacementPolicy) {
    let spec = mig(key);
    let (occupancy, one_g) = partly_used(&spec);
    bencher.bench_local(|| {
        choose(
            black_box(&occupancy),
            black_box(one_g),
            black_box(spec.profiles),
            policy,
        )
    });
}

/// `choose` for a 1g instance, FirstFit.
#[divan::bench(args = BENCH_GPUS)]
fn choose_first_fit(bencher: Bencher, key: &str) {
    bench_choose(bencher, key, PlacementPolicy::FirstFit);
}

/// `choose` for a 1g instance, MostRoom.
#[divan::bench(args = BENCH_GPUS)]
fn choose_most_room(bencher: Bencher, key: &str) {
    bench_choose(bencher, key, PlacementPolicy::MostRoom);
}

/// `choose` for a 1g instance, LeastStranded.
#[divan::bench(args = BENCH_GPUS)]
fn choose_least_stranded(bencher: Bencher, key: &str) {
    bench_choose(bencher, key, PlacementPolicy::LeastStranded);
}

/// `free_placements` of every profile of the GPU.
#[divan::bench(args = BENCH_GPUS)]
fn free_placements_all_profiles(bencher: Bencher, key: &str) {
    let spec = mig(key);
    let (occupancy, _) = partly_used(&spec);
    bencher.bench_local(|| {
        for profile in black_box(spec.profiles) {
            black_box(free_placements(black_box(&occupancy), profile));
        }
    });
}
