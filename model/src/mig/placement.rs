//! Placements on the memory-slice axis of a MIG-capable GPU, and the placement
//! engine that checks and chooses them.
//!
//! A GPU instance sits at a placement `{start, size}` in memory slices; two
//! instances conflict when their intervals overlap. The axis has `axis_len`
//! slots (8 on A100/H100, 4 on A30, 12 on RTX PRO 6000; never assume 8), at
//! most [`MAX_AXIS_LEN`]. [`Occupancy`] keeps the instances of one GPU as two
//! bitmaps; a profile's legal placements come from any [`ProfileLayout`]: the
//! static catalogue ([`GiProfileSpec`](super::catalogue::GiProfileSpec)) or
//! [`ProfilePlacements`] built from what NVML reports on a real node.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest memory-slice axis the engine models (one bit per slot in a `u64`).
pub const MAX_AXIS_LEN: u32 = 64;

/// A GPU instance's position on the memory-slice axis: slices `start .. start+size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl Placement {
    /// A placement of `size` slices from `start`; fails when it is empty or runs
    /// past [`MAX_AXIS_LEN`]. Whether it fits a particular GPU is [`Occupancy`]'s check.
    pub fn new(start: u32, size: u32) -> Result<Self, PlacementError> {
        if size == 0 {
            return Err(PlacementError::Empty { start });
        }
        let placement = Placement { start, size };
        match start.checked_add(size) {
            Some(end) if end <= MAX_AXIS_LEN => Ok(placement),
            _ => Err(PlacementError::TooLong { placement }),
        }
    }

    /// One past the last slice (`start + size`, saturating).
    pub const fn end(&self) -> u32 {
        self.start.saturating_add(self.size)
    }

    /// True when the two placements share at least one slice (touching is not overlapping).
    pub const fn overlaps(&self, other: &Placement) -> bool {
        self.size > 0 && other.size > 0 && self.start < other.end() && other.start < self.end()
    }

    /// The slices as bits: bit `i` set for `start <= i < end` (slices past 63 are dropped).
    pub const fn mask(&self) -> u64 {
        range_mask(self.start, self.end())
    }
}

impl fmt::Display for Placement {
    /// Writes `{start 6, size 2}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{start {}, size {}}}", self.start, self.size)
    }
}

/// Bits `start .. end`, clipped to 64 bits; zero when `end <= start`.
const fn range_mask(start: u32, end: u32) -> u64 {
    low_bits(end) & !low_bits(start)
}

/// Bits `0 .. n`, all of them for `n >= 64`.
const fn low_bits(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// Why a placement was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The placement has no slices.
    #[error("placement {{start {start}, size 0}} is empty: an instance takes at least one slice")]
    Empty {
        /// Its start.
        start: u32,
    },
    /// The placement runs past the longest axis the engine models.
    #[error(
        "placement {placement} runs past slice {MAX_AXIS_LEN}, the longest axis Tessera models"
    )]
    TooLong {
        /// The offending placement.
        placement: Placement,
    },
    /// An axis length outside `1..=64`.
    #[error("an axis of {axis_len} slots is not supported: it must have 1 to {MAX_AXIS_LEN}")]
    InvalidAxis {
        /// The requested length.
        axis_len: u32,
    },
    /// The placement does not fit on this GPU's axis.
    #[error("placement {placement} exceeds the GPU's {axis_len}-slot axis")]
    ExceedsAxis {
        /// The offending placement.
        placement: Placement,
        /// The GPU's axis length.
        axis_len: u32,
    },
    /// The placement overlaps an instance that exists.
    #[error("placement {placement} overlaps instance at {existing}")]
    Overlaps {
        /// The refused placement.
        placement: Placement,
        /// The lowest instance it overlaps.
        existing: Placement,
    },
    /// The profile cannot start at this slice.
    #[error(
        "placement start {start} is not legal for profile {profile} (legal starts: {})",
        list_starts(.legal_starts)
    )]
    IllegalStart {
        /// The refused start.
        start: u32,
        /// Profile name.
        profile: String,
        /// Starts the profile allows, ascending.
        legal_starts: Vec<u32>,
    },
    /// The profile can start here, but with another size.
    #[error(
        "placement {placement} is not legal for profile {profile}: it takes {expected} slices there"
    )]
    WrongSize {
        /// The refused placement.
        placement: Placement,
        /// Profile name.
        profile: String,
        /// The size the profile takes at that start.
        expected: u32,
    },
    /// Release of a placement that is not exactly an existing instance.
    #[error("no instance at {placement} to release")]
    NotOccupied {
        /// The placement asked for.
        placement: Placement,
    },
}

fn list_starts(starts: &[u32]) -> String {
    if starts.is_empty() {
        return "none".to_owned();
    }
    let parts: Vec<String> = starts.iter().map(u32::to_string).collect();
    parts.join(", ")
}

/// The instances on one GPU's memory-slice axis, as bitmaps: which slots are
/// used and which slots start an instance. `Copy`, allocation-free, and never
/// double-books a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Occupancy {
    axis_len: u32,
    /// Bit `i`: slot `i` belongs to an instance.
    used: u64,
    /// Bit `i`: an instance starts at slot `i`.
    starts: u64,
}

impl Occupancy {
    /// An empty axis of `axis_len` slots (1 to [`MAX_AXIS_LEN`]).
    pub fn new(axis_len: u32) -> Result<Self, PlacementError> {
        if axis_len == 0 || axis_len > MAX_AXIS_LEN {
            return Err(PlacementError::InvalidAxis { axis_len });
        }
        Ok(Occupancy {
            axis_len,
            used: 0,
            starts: 0,
        })
    }

    /// An axis holding these instances; fails on the first that does not fit or overlaps.
    pub fn with(
        axis_len: u32,
        placements: impl IntoIterator<Item = Placement>,
    ) -> Result<Self, PlacementError> {
        let mut occupancy = Occupancy::new(axis_len)?;
        for placement in placements {
            occupancy.occupy(placement)?;
        }
        Ok(occupancy)
    }

    /// Number of slots on the axis.
    pub fn axis_len(&self) -> u32 {
        self.axis_len
    }

    /// Used slots as bits (bit `i` = slot `i`).
    pub fn used_mask(&self) -> u64 {
        self.used
    }

    /// Number of used slots.
    pub fn used_slots(&self) -> u32 {
        self.used.count_ones()
    }

    /// Number of free slots.
    pub fn free_slots(&self) -> u32 {
        self.axis_len - self.used_slots()
    }

    /// True when no instance exists.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Checks that the placement is non-empty and lies on this axis.
    pub fn check_fits(&self, placement: Placement) -> Result<(), PlacementError> {
        if placement.size == 0 {
            Err(PlacementError::Empty {
                start: placement.start,
            })
        } else if placement.end() > self.axis_len {
            Err(PlacementError::ExceedsAxis {
                placement,
                axis_len: self.axis_len,
            })
        } else {
            Ok(())
        }
    }

    /// True when the placement lies on this axis and none of its slots is used.
    pub fn is_free(&self, placement: Placement) -> bool {
        self.check_fits(placement).is_ok() && self.used & placement.mask() == 0
    }

    /// Records an instance at `placement`; fails, changing nothing, when it does
    /// not fit the axis or overlaps an instance.
    pub fn occupy(&mut self, placement: Placement) -> Result<(), PlacementError> {
        self.check_fits(placement)?;
        let clash = self.used & placement.mask();
        if clash != 0 {
            let slot = clash.trailing_zeros();
            let existing = self.instance_at(slot).unwrap_or(Placement {
                start: slot,
                size: 1,
            });
            return Err(PlacementError::Overlaps {
                placement,
                existing,
            });
        }
        self.used |= placement.mask();
        self.starts |= 1u64 << placement.start;
        Ok(())
    }

    /// Checks that `placement` is legal for `profile`, then [occupies](Self::occupy) it.
    pub fn place<P: ProfileLayout + ?Sized>(
        &mut self,
        profile: &P,
        placement: Placement,
    ) -> Result<(), PlacementError> {
        check_legal(profile, placement)?;
        self.occupy(placement)
    }

    /// Removes the instance at exactly `placement`; fails, changing nothing, when
    /// no instance has that start and size.
    pub fn release(&mut self, placement: Placement) -> Result<(), PlacementError> {
        if self.check_fits(placement).is_err()
            || self.instance_at(placement.start) != Some(placement)
        {
            return Err(PlacementError::NotOccupied { placement });
        }
        self.used &= !placement.mask();
        self.starts &= !(1u64 << placement.start);
        Ok(())
    }

    /// The instance that holds `slot`, if any.
    pub fn instance_at(&self, slot: u32) -> Option<Placement> {
        if slot >= self.axis_len || self.used & (1u64 << slot) == 0 {
            return None;
        }
        let starts_up_to_slot = self.starts & low_bits(slot + 1);
        if starts_up_to_slot == 0 {
            return None;
        }
        let start = 63 - starts_up_to_slot.leading_zeros();
        Some(Placement {
            start,
            size: self.end_of(start) - start,
        })
    }

    /// The instances, ascending by start.
    pub fn instances(&self) -> impl Iterator<Item = Placement> + use<> {
        let this = *self;
        let mut starts = self.starts;
        std::iter::from_fn(move || {
            if starts == 0 {
                return None;
            }
            let start = starts.trailing_zeros();
            starts &= starts - 1;
            Some(Placement {
                start,
                size: this.end_of(start) - start,
            })
        })
    }

    /// End of the instance starting at `start`: the first later slot that is
    /// free or starts another instance.
    fn end_of(&self, start: u32) -> u32 {
        let stop = (!self.used | self.starts) & !low_bits(start + 1);
        if stop == 0 { 64 } else { stop.trailing_zeros() }
    }
}

/// A GPU-instance profile's legal placements, wherever they come from: the
/// static catalogue, or NVML on a real node ([`ProfilePlacements`]).
pub trait ProfileLayout {
    /// Device profile id.
    fn profile_id(&self) -> u32;
    /// Profile name for messages, e.g. `3g.40gb`.
    fn profile_name(&self) -> &str;
    /// Every legal placement of the profile, on an empty GPU.
    fn legal_placements(&self) -> impl Iterator<Item = Placement>;
}

impl<T: ProfileLayout + ?Sized> ProfileLayout for &T {
    fn profile_id(&self) -> u32 {
        (**self).profile_id()
    }

    fn profile_name(&self) -> &str {
        (**self).profile_name()
    }

    fn legal_placements(&self) -> impl Iterator<Item = Placement> {
        (**self).legal_placements()
    }
}

/// A profile's legal placements as data: what a real node builds from
/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfilePlacements {
    /// Device profile id.
    pub profile_id: u32,
    /// Profile name, e.g. `1g.10gb`.
    pub name: String,
    /// Legal placements, ascending.
    pub placements: Vec<Placement>,
}

impl ProfilePlacements {
    /// A profile's placements, sorted ascending with duplicates dropped.
    pub fn new(profile_id: u32, name: impl Into<String>, mut placements: Vec<Placement>) -> Self {
        placements.sort_unstable();
        placements.dedup();
        ProfilePlacements {
            profile_id,
            name: name.into(),
            placements,
        }
    }

    /// The same facts as any other layout (e.g. a catalogue profile), owned.
    pub fn of<P: ProfileLayout + ?Sized>(profile: &P) -> Self {
        ProfilePlacements::new(
            profile.profile_id(),
            profile.profile_name(),
            profile.legal_placements().collect(),
        )
    }
}

impl ProfileLayout for ProfilePlacements {
    fn profile_id(&self) -> u32 {
        self.profile_id
    }

    fn profile_name(&self) -> &str {
        &self.name
    }

    fn legal_placements(&self) -> impl Iterator<Item = Placement> {
        self.placements.iter().copied()
    }
}

/// Axis length of a GPU from its profiles: `max(start + size)` over every legal
/// placement (0 when there are none).
pub fn axis_len_of<P: ProfileLayout>(profiles: &[P]) -> u32 {
    profiles
        .iter()
        .flat_map(|p| p.legal_placements().map(|l| l.end()))
        .max()
        .unwrap_or(0)
}

/// True when `placement` is one of the profile's legal placements.
pub fn is_legal<P: ProfileLayout + ?Sized>(profile: &P, placement: Placement) -> bool {
    profile.legal_placements().any(|l| l == placement)
}

/// [`is_legal`], with an error that says what the profile allows.
pub fn check_legal<P: ProfileLayout + ?Sized>(
    profile: &P,
    placement: Placement,
) -> Result<(), PlacementError> {
    if is_legal(profile, placement) {
        return Ok(());
    }
    if let Some(same_start) = profile
        .legal_placements()
        .find(|l| l.start == placement.start)
    {
        return Err(PlacementError::WrongSize {
            placement,
            profile: profile.profile_name().to_owned(),
            expected: same_start.size,
        });
    }
    let mut legal_starts: Vec<u32> = profile.legal_placements().map(|l| l.start).collect();
    legal_starts.sort_unstable();
    legal_starts.dedup();
    Err(PlacementError::IllegalStart {
        start: placement.start,
        profile: profile.profile_name().to_owned(),
        legal_starts,
    })
}

/// The profile's legal placements that are free now, ascending.
pub fn free_placements<P: ProfileLayout + ?Sized>(
    occupancy: &Occupancy,
    profile: &P,
) -> Vec<Placement> {
    let mut free: Vec<Placement> = profile
        .legal_placements()
        .filter(|&l| occupancy.is_free(l))
        .collect();
    free.sort_unstable();
    free.dedup();
    free
}

/// Room left on a GPU: the number of free legal placements, summed over
/// `profiles` (a profile listed twice counts twice; two profiles with the same
/// placements each count theirs). The score [`PlacementPolicy::MostRoom`] maximizes;
/// also a way to rank GPUs by how much they can still take.
pub fn room<P: ProfileLayout>(occupancy: &Occupancy, profiles: &[P]) -> usize {
    room_with_used(occupancy, occupancy.used, profiles)
}

fn room_with_used<P: ProfileLayout>(occupancy: &Occupancy, used: u64, profiles: &[P]) -> usize {
    profiles
        .iter()
        .map(|p| {
            p.legal_placements()
                .filter(|&l| occupancy.check_fits(l).is_ok() && used & l.mask() == 0)
                .count()
        })
        .sum()
}

/// How [`choose`] picks among the free legal placements of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementPolicy {
    /// The free legal placement with the lowest start (then the smallest size).
    FirstFit,
    /// The free legal placement that leaves the most [`room`]: after placing it,
    /// the number of free legal placements summed over all the GPU's profiles is
    /// the largest. Ties go to the lowest start (then the smallest size), so
    /// the choice is deterministic and equals `FirstFit` when all candidates
    /// score alike. On an empty A100 it puts a 1g at slice 6, a 2g or a 3g at
    /// slice 4, keeping the 4g/3g at slice 0 possible.
    #[default]
    MostRoom,
    /// The free legal placement that strands the fewest free slots, then
    /// leaves the most [`room`]: after placing it, the number of free slots
    /// that some free legal placement (of any of the GPU's profiles) still
    /// covers is the largest; ties go to `MostRoom`'s score, then to the
    /// lowest start (then the smallest size). A slot no free placement covers
    /// is lost until a neighbour leaves, which room alone does not see: on an
    /// empty A100, `MostRoom` puts a 1g at slice 6, where slot 7 (usable only
    /// by a 1g.10gb at 6, a 3g at 4 or the 7g) is stranded, while this policy
    /// puts it at slice 4. In the `mig_acceptance` bench (four models, loads
    /// 0.5, 1 and 2) it accepts 97.1 % of the offline optimum (`MostRoom`
    /// 96.6 %) and 99.6 % of what the best online policy for that very
    /// workload accepts (`MostRoom` 99.1 %); it gains most under heavy load.
    LeastStranded,
}

/// The placement to give a new instance of `target` on a GPU whose instances
/// are `occupancy` and whose profiles are `profiles`, or `None` when no legal
/// placement of `target` is free. Placement only: per-profile instance limits
/// (e.g. one `+me` instance per GPU) are the caller's check.
pub fn choose<P: ProfileLayout + ?Sized, Q: ProfileLayout>(
    occupancy: &Occupancy,
    target: &P,
    profiles: &[Q],
    policy: PlacementPolicy,
) -> Option<Placement> {
    let free = target.legal_placements().filter(|&l| occupancy.is_free(l));
    match policy {
        PlacementPolicy::FirstFit => free.min(),
        PlacementPolicy::MostRoom => {
            let mut best: Option<(usize, Placement)> = None;
            for candidate in free {
                let score = room_with_used(occupancy, occupancy.used | candidate.mask(), profiles);
                let better = match best {
                    None => true,
                    Some((best_score, best_placement)) => {
                        score > best_score || (score == best_score && candidate < best_placement)
                    }
                };
                if better {
                    best = Some((score, candidate));
                }
            }
            best.map(|(_, placement)| placement)
        }
        PlacementPolicy::LeastStranded => {
            let mut best: Option<((u32, usize), Placement)> = None;
            for candidate in free {
                let score = usable_and_room(occupancy, occupancy.used | candidate.mask(), profiles);
                let better = match best {
                    None => true,
                    Some((best_score, best_placement)) => {
                        score > best_score || (score == best_score && candidate < best_placement)
                    }
                };
                if better {
                    best = Some((score, candidate));
                }
            }
            best.map(|(_, placement)| placement)
        }
    }
}

/// With slots `used`: the free slots some free legal placement of `profiles`
/// covers, and the [`room`] (free legal placements summed over `profiles`).
fn usable_and_room<P: ProfileLayout>(
    occupancy: &Occupancy,
    used: u64,
    profiles: &[P],
) -> (u32, usize) {
    let mut covered = 0u64;
    let mut room = 0;
    for placement in profiles.iter().flat_map(|p| p.legal_placements()) {
        if occupancy.check_fits(placement).is_ok() && used & placement.mask() == 0 {
            covered |= placement.mask();
            room += 1;
        }
    }
    ((covered & !used).count_ones(), room)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalogue::{self, GiProfileSpec, MigSpec};

    fn p(start: u32, size: u32) -> Placement {
        Placement { start, size }
    }

    fn mig(key: &str) -> MigSpec {
        catalogue::find(key)
            .and_then(|m| m.mig)
            .unwrap_or_else(|| panic!("catalogue has no MIG model {key}"))
    }

    fn profile(spec: &MigSpec, name: &str) -> &'static GiProfileSpec {
        spec.profile_by_name(name)
            .unwrap_or_else(|| panic!("no profile {name}"))
    }

    fn occ(axis_len: u32, placements: &[Placement]) -> Occupancy {
        Occupancy::with(axis_len, placements.iter().copied()).expect("valid occupancy")
    }

    #[test]
    fn placement_new_refuses_empty_and_too_long() {
        assert_eq!(
            Placement::new(3, 0),
            Err(PlacementError::Empty { start: 3 })
        );
        assert_eq!(
            Placement::new(60, 8),
            Err(PlacementError::TooLong {
                placement: p(60, 8)
            })
        );
        assert!(Placement::new(u32::MAX, 2).is_err());
        assert_eq!(Placement::new(63, 1), Ok(p(63, 1)));
        assert_eq!(Placement::new(0, 64), Ok(p(0, 64)));
    }

    #[test]
    fn placement_geometry() {
        assert_eq!(p(4, 4).end(), 8);
        assert!(p(4, 4).overlaps(&p(6, 2)));
        assert!(p(6, 2).overlaps(&p(4, 4)));
        assert!(!p(0, 4).overlaps(&p(4, 4)), "touching is not overlapping");
        assert!(
            !p(0, 0).overlaps(&p(0, 4)),
            "an empty placement overlaps nothing"
        );
        assert_eq!(p(0, 1).mask(), 0b1);
        assert_eq!(p(4, 4).mask(), 0b1111_0000);
        assert_eq!(p(0, 64).mask(), u64::MAX);
        assert_eq!(p(63, 1).mask(), 1u64 << 63);
        assert_eq!(p(62, 8).mask(), 0b11u64 << 62, "bits past 63 are dropped");
        assert_eq!(p(70, 1).mask(), 0);
        assert_eq!(p(3, 0).mask(), 0);
        assert_eq!(p(6, 2).to_string(), "{start 6, size 2}");
    }

    #[test]
    fn error_messages_are_one_line_and_name_the_values() {
        let a100 = mig("A100-40GB");
        let mut o = occ(8, &[p(4, 4)]);
        let err = o.occupy(p(6, 2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "placement {start 6, size 2} overlaps instance at {start 4, size 4}"
        );
        let err = check_legal(profile(&a100, "3g.20gb"), p(3, 4)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "placement start 3 is not legal for profile 3g.20gb (legal starts: 0, 4)"
        );
        let err = check_legal(profile(&a100, "3g.20gb"), p(4, 2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "placement {start 4, size 2} is not legal for profile 3g.20gb: it takes 4 slices there"
        );
        let err = o.occupy(p(6, 4)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "placement {start 6, size 4} exceeds the GPU's 8-slot axis"
        );
        let err = o.release(p(4, 2)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no instance at {start 4, size 2} to release"
        );
        let err = Occupancy::new(65).unwrap_err();
        assert_eq!(
            err.to_string(),
            "an axis of 65 slots is not supported: it must have 1 to 64"
        );
        for e in [
            PlacementError::Empty { start: 1 },
            PlacementError::TooLong {
                placement: p(60, 8),
            },
        ] {
            assert!(!e.to_string().contains('\n'));
        }
        let empty = ProfilePlacements::new(1, "odd", vec![]);
        assert_eq!(
            check_legal(&empty, p(0, 1)).unwrap_err().to_string(),
            "placement start 0 is not legal for profile odd (legal starts: none)"
        );
    }

    /// The A100-40GB layout written out from mig.md, independent of the catalogue.
    const A100_TABLE: &[(&str, u32, &[u32])] = &[
        ("1g.5gb", 1, &[0, 1, 2, 3, 4, 5, 6]),
        ("1g.5gb+me", 1, &[0, 1, 2, 3, 4, 5, 6]),
        ("1g.10gb", 2, &[0, 2, 4, 6]),
        ("2g.10gb", 2, &[0, 2, 4]),
        ("3g.20gb", 4, &[0, 4]),
        ("4g.20gb", 4, &[0]),
        ("7g.40gb", 8, &[0]),
    ];

    /// The RTX PRO 6000 Blackwell layout (12-slot axis) from mig.md.
    const RTX_TABLE: &[(&str, u32, &[u32])] = &[
        ("1g.24gb", 3, &[0, 3, 6, 9]),
        ("1g.24gb+me", 3, &[0, 3, 6, 9]),
        ("2g.48gb", 6, &[0, 6]),
        ("4g.96gb", 12, &[0]),
    ];

    fn check_every_case(key: &str, axis: u32, table: &[(&str, u32, &[u32])]) {
        let spec = mig(key);
        assert_eq!(spec.axis_len, axis);
        assert_eq!(axis_len_of(spec.profiles), axis);
        let empty = Occupancy::new(axis).unwrap();
        for &(name, size, starts) in table {
            let prof = profile(&spec, name);
            for start in 0..=axis {
                for s in 1..=axis {
                    let pl = p(start, s);
                    let expected = s == size && starts.contains(&start);
                    assert_eq!(
                        is_legal(prof, pl),
                        expected,
                        "{key} {name} at {pl}: expected legal={expected}"
                    );
                    assert_eq!(check_legal(prof, pl).is_ok(), expected, "{key} {name} {pl}");
                    let mut o = empty;
                    let placed = o.place(prof, pl);
                    assert_eq!(
                        placed.is_ok(),
                        expected,
                        "{key} {name} place {pl}: {placed:?}"
                    );
                    if !expected {
                        assert_eq!(o, empty, "a refused placement changes nothing");
                        let err = check_legal(prof, pl).unwrap_err();
                        if starts.contains(&start) {
                            assert_eq!(
                                err,
                                PlacementError::WrongSize {
                                    placement: pl,
                                    profile: name.to_owned(),
                                    expected: size
                                }
                            );
                        } else {
                            assert_eq!(
                                err,
                                PlacementError::IllegalStart {
                                    start,
                                    profile: name.to_owned(),
                                    legal_starts: starts.to_vec()
                                }
                            );
                        }
                    }
                }
            }
            let expected: Vec<Placement> = starts.iter().map(|&st| p(st, size)).collect();
            assert_eq!(
                free_placements(&empty, prof),
                expected,
                "{key} {name} free on empty"
            );
        }
    }

    #[test]
    fn a100_40gb_every_profile_start_and_size() {
        check_every_case("A100-40GB", 8, A100_TABLE);
    }

    #[test]
    fn rtx_pro_6000_every_profile_start_and_size_on_12_slots() {
        check_every_case("RTX-PRO-6000", 12, RTX_TABLE);
    }

    #[test]
    fn occupancy_refuses_overlaps_and_reports_the_lowest_instance() {
        let mut o = occ(8, &[p(0, 2), p(4, 4)]);
        assert_eq!(
            o.occupy(p(1, 4)),
            Err(PlacementError::Overlaps {
                placement: p(1, 4),
                existing: p(0, 2)
            })
        );
        assert_eq!(
            o.occupy(p(0, 8)),
            Err(PlacementError::Overlaps {
                placement: p(0, 8),
                existing: p(0, 2)
            })
        );
        assert_eq!(o.occupy(p(2, 2)), Ok(()), "adjacent on both sides is fine");
        assert_eq!(o.used_slots(), 8);
        assert_eq!(o.free_slots(), 0);
        assert_eq!(
            o.instances().collect::<Vec<_>>(),
            vec![p(0, 2), p(2, 2), p(4, 4)]
        );
        assert_eq!(o.instance_at(3), Some(p(2, 2)));
        assert_eq!(o.instance_at(7), Some(p(4, 4)));
        assert_eq!(o.instance_at(8), None);
        assert_eq!(o.occupy(p(0, 0)), Err(PlacementError::Empty { start: 0 }));
        assert!(Occupancy::with(8, [p(0, 4), p(2, 2)]).is_err());
        assert!(Occupancy::new(0).is_err());
    }

    #[test]
    fn release_takes_exactly_an_instance() {
        let mut o = occ(8, &[p(0, 2), p(2, 2)]);
        assert!(o.release(p(0, 4)).is_err(), "two instances are not one");
        assert!(o.release(p(0, 1)).is_err(), "part of an instance");
        assert!(o.release(p(1, 1)).is_err());
        assert!(o.release(p(6, 2)).is_err(), "free slots");
        assert!(o.release(p(6, 4)).is_err(), "off the axis");
        assert_eq!(o.release(p(0, 2)), Ok(()));
        assert_eq!(o.instances().collect::<Vec<_>>(), vec![p(2, 2)]);
        assert!(o.is_free(p(0, 2)));
        assert!(!o.is_free(p(0, 4)));
        assert_eq!(o.release(p(2, 2)), Ok(()));
        assert!(o.is_empty());
    }

    #[test]
    fn full_64_slot_axis() {
        let mut o = Occupancy::new(64).unwrap();
        assert!(o.is_free(p(0, 64)));
        assert_eq!(o.occupy(p(63, 1)), Ok(()));
        assert_eq!(o.instance_at(63), Some(p(63, 1)));
        assert_eq!(o.occupy(p(0, 63)), Ok(()));
        assert_eq!(o.used_slots(), 64);
        assert_eq!(o.instances().collect::<Vec<_>>(), vec![p(0, 63), p(63, 1)]);
        assert_eq!(o.release(p(63, 1)), Ok(()));
        assert_eq!(o.instance_at(10), Some(p(0, 63)));
    }

    #[test]
    fn free_placements_after_some_instances() {
        let a100 = mig("A100-40GB");
        let o = occ(8, &[p(0, 1), p(4, 4)]);
        let free = |name: &str| free_placements(&o, profile(&a100, name));
        assert_eq!(free("1g.5gb"), vec![p(1, 1), p(2, 1), p(3, 1)]);
        assert_eq!(free("1g.10gb"), vec![p(2, 2)]);
        assert_eq!(free("2g.10gb"), vec![p(2, 2)]);
        assert_eq!(free("3g.20gb"), vec![]);
        assert_eq!(free("4g.20gb"), vec![]);
        assert_eq!(free("7g.40gb"), vec![]);

        let rtx = mig("RTX-PRO-6000");
        let o = occ(12, &[p(3, 3)]);
        assert_eq!(
            free_placements(&o, profile(&rtx, "1g.24gb")),
            vec![p(0, 3), p(6, 3), p(9, 3)]
        );
        assert_eq!(free_placements(&o, profile(&rtx, "2g.48gb")), vec![p(6, 6)]);
        assert_eq!(free_placements(&o, profile(&rtx, "4g.96gb")), vec![]);
    }

    #[test]
    fn room_counts_free_legal_placements_over_profiles() {
        let a100 = mig("A100-40GB");
        let empty = Occupancy::new(8).unwrap();
        // 7 + 7 (+me) + 4 + 3 + 2 + 1 + 1
        assert_eq!(room(&empty, a100.profiles), 25);
        // 1g at 6 leaves 6 + 6 + 3 (1g.10gb) + 3 (2g) + 1 (3g@0) + 1 (4g) + 0.
        assert_eq!(room(&occ(8, &[p(6, 1)]), a100.profiles), 20);
        assert_eq!(room(&occ(8, &[p(0, 8)]), a100.profiles), 0);
    }

    /// Checks what `policy` chooses in `o` for each `(model, profile, chosen)`.
    fn assert_chosen(
        policy: PlacementPolicy,
        o: &Occupancy,
        cases: &[(&str, &str, Option<Placement>)],
    ) {
        for &(key, name, want) in cases {
            let spec = mig(key);
            assert_eq!(
                choose(o, profile(&spec, name), spec.profiles, policy),
                want,
                "{name} on {key} under {policy:?}"
            );
        }
    }

    #[test]
    fn first_fit_takes_the_lowest_free_legal_start() {
        use PlacementPolicy::FirstFit;
        let empty = Occupancy::new(8).unwrap();
        assert_chosen(
            FirstFit,
            &empty,
            &[
                ("A100-40GB", "1g.5gb", Some(p(0, 1))),
                ("A100-40GB", "3g.20gb", Some(p(0, 4))),
            ],
        );
        assert_chosen(
            FirstFit,
            &occ(8, &[p(0, 1), p(2, 1)]),
            &[
                ("A100-40GB", "1g.5gb", Some(p(1, 1))),
                ("A100-40GB", "2g.10gb", Some(p(4, 2))),
                ("A100-40GB", "4g.20gb", None),
            ],
        );
    }

    #[test]
    fn most_room_keeps_the_big_profiles_possible_on_an_empty_a100() {
        let empty = Occupancy::new(8).unwrap();
        assert_chosen(
            PlacementPolicy::MostRoom,
            &empty,
            &[
                // Worked by hand: 1g at 0..3 scores 18, at 4/5 scores 19, at 6 scores 20.
                ("A100-40GB", "1g.5gb", Some(p(6, 1))),
                ("A100-40GB", "1g.10gb", Some(p(6, 2))),
                ("A100-40GB", "2g.10gb", Some(p(4, 2))),
                // 3g at 4 scores 14 (4g/3g at 0 stay possible), at 0 scores 10.
                ("A100-40GB", "3g.20gb", Some(p(4, 4))),
                ("A100-40GB", "4g.20gb", Some(p(0, 4))),
                ("A100-40GB", "7g.40gb", Some(p(0, 8))),
                // The same layout on H100.
                ("H100-80GB", "1g.10gb", Some(p(6, 1))),
                ("H100-80GB", "3g.40gb", Some(p(4, 4))),
            ],
        );
    }

    #[test]
    fn most_room_packs_small_instances_together() {
        use PlacementPolicy::MostRoom;
        let a100 = mig("A100-40GB");
        let one_g = profile(&a100, "1g.5gb");
        let mut o = Occupancy::new(8).unwrap();
        let mut order = vec![];
        for _ in 0..7 {
            let pl = choose(&o, one_g, a100.profiles, MostRoom).expect("room for a 1g");
            o.place(one_g, pl).unwrap();
            order.push(pl.start);
        }
        // 6 first; then 4 and 5 tie at 16 and the lower start wins; 5 fills the
        // 4..8 half; the 0..4 half then fills as a 4g/3g would no longer fit anyway.
        assert_eq!(order, vec![6, 4, 5, 0, 1, 2, 3]);
        assert_eq!(choose(&o, one_g, a100.profiles, MostRoom), None);

        // With 4g at 0, the 3g can only go to 4, and a 1g goes beside it at 6.
        assert_chosen(
            MostRoom,
            &occ(8, &[p(0, 4)]),
            &[
                ("A100-40GB", "3g.20gb", Some(p(4, 4))),
                ("A100-40GB", "1g.5gb", Some(p(6, 1))),
            ],
        );
        // With 2g at 4, a 1g goes to 6 (keeps 2g@0/2 and 3g@0).
        assert_chosen(
            MostRoom,
            &occ(8, &[p(4, 2)]),
            &[("A100-40GB", "1g.5gb", Some(p(6, 1)))],
        );
    }

    /// Expectations derived by hand from the mig.md layouts (all profiles of
    /// the model, `+me` variants included).
    #[test]
    fn least_stranded_keeps_free_slots_usable() {
        use PlacementPolicy::{LeastStranded, MostRoom};
        let empty = Occupancy::new(8).unwrap();
        // A 1g at 6 strands slot 7; at 4 or 5 the 4g at 0 stays possible (one
        // more free placement than at 0..3); 4 is the lower start.
        assert_chosen(
            LeastStranded,
            &empty,
            &[
                ("A100-40GB", "1g.5gb", Some(p(4, 1))),
                // Every 1g.10gb start leaves 6 usable slots; at 6 it leaves
                // 20 free placements (6+6 1g, 3 1g.10gb, 3 2g, 3g and 4g at
                // 0), at 4 only 17.
                ("A100-40GB", "1g.10gb", Some(p(6, 2))),
                // 3g at 4 leaves 14 free placements, at 0 only 10.
                ("A100-40GB", "3g.20gb", Some(p(4, 4))),
                ("A100-40GB", "7g.40gb", Some(p(0, 8))),
            ],
        );
        // The same GPU under MostRoom: the 1g goes to 6, stranding slot 7.
        assert_chosen(MostRoom, &empty, &[("A100-40GB", "1g.5gb", Some(p(6, 1)))]);
        // A 4g at 0: a 1g at 6 leaves slot 7 to no one (2 usable slots), at 4
        // or 5 slots 6-7 stay a 1g.10gb's (3 usable); 4 is the lower start.
        let o = occ(8, &[p(0, 4)]);
        assert_chosen(LeastStranded, &o, &[("A100-40GB", "1g.5gb", Some(p(4, 1)))]);
        let full = occ(8, &[p(0, 8)]);
        assert_chosen(LeastStranded, &full, &[("A100-40GB", "1g.5gb", None)]);
        // RTX PRO 6000: every 1g start leaves 9 usable slots and 19 free
        // placements (5 1g profiles × 3, 4 2g profiles × 1): the lowest wins.
        let empty12 = Occupancy::new(12).unwrap();
        assert_chosen(
            LeastStranded,
            &empty12,
            &[("RTX-PRO-6000", "1g.24gb", Some(p(0, 3)))],
        );
        let o = occ(12, &[p(0, 6)]);
        assert_chosen(
            LeastStranded,
            &o,
            &[("RTX-PRO-6000", "1g.24gb", Some(p(6, 3)))],
        );
        assert_eq!(
            serde_json::to_string(&LeastStranded).unwrap(),
            "\"least-stranded\""
        );
    }

    #[test]
    fn most_room_on_the_12_slot_axis() {
        use PlacementPolicy::{FirstFit, MostRoom};
        // Every 1g start is alike on an empty RTX PRO 6000: the tie goes to 0.
        assert_chosen(
            MostRoom,
            &Occupancy::new(12).unwrap(),
            &[("RTX-PRO-6000", "1g.24gb", Some(p(0, 3)))],
        );
        // Next to it at 3, so the 2g at 6 stays possible.
        for policy in [MostRoom, FirstFit] {
            assert_chosen(
                policy,
                &occ(12, &[p(0, 3)]),
                &[("RTX-PRO-6000", "1g.24gb", Some(p(3, 3)))],
            );
        }
        let o = occ(12, &[p(6, 3)]);
        assert_chosen(
            MostRoom,
            &o,
            &[
                ("RTX-PRO-6000", "1g.24gb", Some(p(9, 3))),
                ("RTX-PRO-6000", "2g.48gb", Some(p(0, 6))),
                ("RTX-PRO-6000", "4g.96gb", None),
            ],
        );
        assert_chosen(FirstFit, &o, &[("RTX-PRO-6000", "1g.24gb", Some(p(0, 3)))]);
    }

    #[test]
    fn nvml_style_placements_work_like_the_catalogue() {
        let a100 = mig("A100-40GB");
        let owned: Vec<ProfilePlacements> =
            a100.profiles.iter().map(ProfilePlacements::of).collect();
        let o = occ(8, &[p(6, 1)]);
        for (spec, prof) in a100.profiles.iter().zip(&owned) {
            assert_eq!(prof.profile_id(), spec.id);
            assert_eq!(free_placements(&o, prof), free_placements(&o, spec));
            for policy in [PlacementPolicy::FirstFit, PlacementPolicy::MostRoom] {
                assert_eq!(
                    choose(&o, prof, &owned, policy),
                    choose(&o, spec, a100.profiles, policy)
                );
            }
        }
        // Unsorted, duplicated input is normalized.
        let prof = ProfilePlacements::new(9, "3g.20gb", vec![p(4, 4), p(0, 4), p(4, 4)]);
        assert_eq!(prof.placements, vec![p(0, 4), p(4, 4)]);
        assert_eq!(axis_len_of(&[prof]), 8);
        assert_eq!(axis_len_of::<ProfilePlacements>(&[]), 0);
    }

    #[test]
    fn policy_serializes_in_kebab_case() {
        assert_eq!(
            serde_json::to_string(&PlacementPolicy::MostRoom).unwrap(),
            "\"most-room\""
        );
        assert_eq!(
            serde_json::from_str::<PlacementPolicy>("\"first-fit\"").unwrap(),
            PlacementPolicy::FirstFit
        );
    }

    mod proptests {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Occupy(u32, u32),
            Release(usize),
            ReleaseRaw(u32, u32),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0u32..14, 0u32..14).prop_map(|(s, n)| Op::Occupy(s, n)),
                2 => (0usize..16).prop_map(Op::Release),
                1 => (0u32..14, 0u32..14).prop_map(|(s, n)| Op::ReleaseRaw(s, n)),
            ]
        }

        proptest! {
            #[test]
            fn occupancy_never_double_books(axis in 1u32..=12, ops in prop::collection::vec(op(), 0..60)) {
                let mut o = Occupancy::new(axis).unwrap();
                let mut model: Vec<Placement> = vec![];
                for op in ops {
                    match op {
                        Op::Occupy(start, size) => {
                            let pl = p(start, size);
                            let ok = size > 0
                                && pl.end() <= axis
                                && model.iter().all(|m| !m.overlaps(&pl));
                            let before = o;
                            let res = o.occupy(pl);
                            prop_assert_eq!(res.is_ok(), ok, "occupy {} on {:?}", pl, model);
                            if ok { model.push(pl) } else { prop_assert_eq!(o, before) }
                        }
                        Op::Release(i) => {
                            if !model.is_empty() {
                                let pl = model.swap_remove(i % model.len());
                                prop_assert_eq!(o.release(pl), Ok(()));
                            }
                        }
                        Op::ReleaseRaw(start, size) => {
                            let pl = p(start, size);
                            let ok = model.contains(&pl);
                            prop_assert_eq!(o.release(pl).is_ok(), ok);
                            if ok { model.retain(|m| *m != pl) }
                        }
                    }
                    model.sort_unstable();
                    let instances: Vec<Placement> = o.instances().collect();
                    prop_assert_eq!(&instances, &model);
                    for (i, a) in instances.iter().enumerate() {
                        for b in &instances[i + 1..] {
                            prop_assert!(!a.overlaps(b), "{} and {} overlap", a, b);
                        }
                    }
                    let total: u32 = model.iter().map(|m| m.size).sum();
                    prop_assert_eq!(o.used_slots(), total);
                    prop_assert!(o.used_slots() <= axis);
                    for slot in 0..axis {
                        let holder = model.iter().find(|m| m.start <= slot && slot < m.end()).copied();
                        prop_assert_eq!(o.instance_at(slot), holder);
                    }
                }
            }
        }
    }
}
