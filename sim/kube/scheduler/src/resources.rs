//! Resource quantities and what a pod requests, as kube-scheduler counts
//! them.
//!
//! Quantities are kept as signed milli-units (`1` cpu = 1000, `1Ki` memory
//! = 1 024 000), rounded up like Kubernetes' `MilliValue`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Resource name → amount in milli-units.
pub type Resources = BTreeMap<String, i128>;

/// The pod-count pseudo-resource of node allocatable.
pub const PODS: &str = "pods";
/// CPU.
pub const CPU: &str = "cpu";
/// Memory.
pub const MEMORY: &str = "memory";
/// Local ephemeral storage.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// A quantity that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity")]
pub struct BadQuantity(pub String);

/// The most a milli-unit amount holds: Kubernetes keeps `MilliValue` in an
/// int64, so larger quantities count as this much (and less as minus it).
pub const MAX_MILLI: i128 = i64::MAX as i128;

/// Significant digits kept exactly; beyond them the quantity is rounded up
/// (still far past [`MAX_MILLI`], so clamping hides the difference).
const MAX_DIGITS: usize = 36;

/// Parses a Kubernetes quantity (`100m`, `1.5Gi`, `2e3`, `4k`) into
/// milli-units, rounding up as `MilliValue` does. Values too large for an
/// i128 saturate; only text that is not a quantity is an error.
pub fn parse_quantity(text: &str) -> Result<i128, BadQuantity> {
    let bad = || BadQuantity(text.to_owned());
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let (bin, dec): (u32, i64) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exp if exp.starts_with(['e', 'E']) => {
            let signed = &exp[1..];
            let digits = signed.strip_prefix(['+', '-']).unwrap_or(signed);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            // Exponents this large only saturate or vanish; keep them in range.
            let limit = 1_000_000;
            let e: i64 = signed.parse().unwrap_or(if signed.starts_with('-') {
                -limit
            } else {
                limit
            });
            (0, e.clamp(-limit, limit))
        }
        _ => return Err(bad()),
    };
    // The value is digits / 10^frac_len × 2^bin × 10^dec.
    let all_digits = format!("{int_part}{frac_part}");
    let significant = all_digits.trim_start_matches('0');
    let mut exp10 = dec + 3 - i64::try_from(frac_part.len()).map_err(|_| bad())?;
    let (kept, dropped) = significant.split_at(significant.len().min(MAX_DIGITS));
    let mut digits: i128 = if kept.is_empty() {
        0
    } else {
        kept.parse().map_err(|_| bad())?
    };
    if !dropped.is_empty() {
        exp10 += i64::try_from(dropped.len()).map_err(|_| bad())?;
        if dropped.bytes().any(|b| b != b'0') {
            digits += 1;
        }
    }
    let scaled = digits.saturating_mul(1i128 << bin);
    let value = if scaled == 0 {
        0
    } else if exp10 >= 0 {
        u32::try_from(exp10)
            .ok()
            .and_then(|e| 10i128.checked_pow(e))
            .map_or(i128::MAX, |p| scaled.saturating_mul(p))
    } else {
        match u32::try_from(-exp10)
            .ok()
            .and_then(|e| 10i128.checked_pow(e))
        {
            // Round up, as MilliValue does (scaled is positive here).
            Some(div) => scaled / div + i128::from(scaled % div != 0),
            // Smaller than a milli-unit, but not zero.
            None => 1,
        }
    };
    Ok(if negative { -value } else { value })
}

/// Milli-units of a quantity, clamped to ±[`MAX_MILLI`]; 0 for one that
/// does not parse (the API server validates quantities; a stand-in one may
/// not).
pub fn milli(q: &Quantity) -> i128 {
    parse_quantity(&q.0)
        .unwrap_or(0)
        .clamp(-MAX_MILLI, MAX_MILLI)
}

/// A resource list as milli-units.
pub fn resource_list(list: Option<&BTreeMap<String, Quantity>>) -> Resources {
    list.into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), milli(v)))
        .collect()
}

/// What one container requests: its requests, and for a resource with a
/// limit but no request, the limit (what API defaulting fills in).
pub fn container_requests(c: &Container) -> Resources {
    requirements(c.resources.as_ref())
}

fn requirements(r: Option<&ResourceRequirements>) -> Resources {
    let mut out = resource_list(r.and_then(|r| r.requests.as_ref()));
    for (k, v) in resource_list(r.and_then(|r| r.limits.as_ref())) {
        out.entry(k).or_insert(v);
    }
    out
}

fn add(into: &mut Resources, from: &Resources) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(0);
        *e = e.saturating_add(*v);
    }
}

fn max_into(into: &mut Resources, from: &Resources) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

/// What a pod requests in all: the sum over its containers, at least the
/// largest init container (restartable "sidecar" init containers run
/// alongside and are added), plus `spec.overhead`.
pub fn pod_requests(pod: &Pod) -> Resources {
    let Some(spec) = &pod.spec else {
        return Resources::new();
    };
    let mut total = Resources::new();
    for c in &spec.containers {
        add(&mut total, &container_requests(c));
    }
    let mut sidecars = Resources::new();
    let mut init_max = Resources::new();
    for c in spec.init_containers.iter().flatten() {
        let req = container_requests(c);
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &req);
            max_into(&mut init_max, &sidecars);
        } else {
            // A regular init container runs with the sidecars started before it.
            let mut with = sidecars.clone();
            add(&mut with, &req);
            max_into(&mut init_max, &with);
        }
    }
    add(&mut total, &sidecars);
    max_into(&mut total, &init_max);
    add(&mut total, &resource_list(spec.overhead.as_ref()));
    total.retain(|_, v| *v != 0);
    total
}

/// kube-scheduler's defaults for scoring a container that requests no cpu
/// (0.1 cpu) or no memory (200 MiB), in milli-units.
pub const DEFAULT_MILLI_CPU_REQUEST: i128 = 100;
/// See [`DEFAULT_MILLI_CPU_REQUEST`].
pub const DEFAULT_MEMORY_REQUEST_MILLI: i128 = 200 * 1024 * 1024 * 1000;

/// cpu and memory for scoring: a container requesting none counts the
/// defaults above, so empty pods still spread.
pub fn nonzero_cpu_memory(pod: &Pod) -> (i128, i128) {
    let Some(spec) = &pod.spec else { return (0, 0) };
    let mut cpu = 0;
    let mut mem = 0;
    for c in &spec.containers {
        let r = container_requests(c);
        cpu = r
            .get(CPU)
            .copied()
            .filter(|v| *v != 0)
            .unwrap_or(DEFAULT_MILLI_CPU_REQUEST)
            .saturating_add(cpu);
        mem = r
            .get(MEMORY)
            .copied()
            .filter(|v| *v != 0)
            .unwrap_or(DEFAULT_MEMORY_REQUEST_MILLI)
            .saturating_add(mem);
    }
    (cpu, mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        let cases: &[(&str, i128)] = &[
            ("1", 1000),
            ("100m", 100),
            ("1.5", 1500),
            ("0.1m", 1),
            ("1Ki", 1_024_000),
            ("2Gi", 2 * (1 << 30) * 1000),
            ("1k", 1_000_000),
            ("1M", 1_000_000_000),
            ("2e3", 2_000_000),
            ("0", 0),
            ("0.000", 0),
            ("250n", 1),
            ("-1", -1000),
            ("007", 7000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_quantity(text), Ok(*want), "{text}");
        }
        // Beyond int64 milli-units: exact here, clamped by milli().
        assert_eq!(parse_quantity("1E"), Ok(1_000_000_000_000_000_000_000));
        assert_eq!(milli(&q("1E")), MAX_MILLI);
        assert_eq!(milli(&q("-1E")), -MAX_MILLI);
        for bad in ["", "x", "1x", "1.2.3", "Gi", "1e", ".", "1e+", "1e--5"] {
            assert!(parse_quantity(bad).is_err(), "{bad:?}");
        }
    }

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(requests.iter().map(|(k, v)| ((*k).into(), q(v))).collect()),
                limits: Some(limits.iter().map(|(k, v)| ((*k).into(), q(v))).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_requests_sum_containers_and_take_init_max() {
        let mut init = container(&[("cpu", "2")], &[]);
        init.name = "init".into();
        let pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![
                    container(&[("cpu", "500m")], &[("example.com/dev", "2")]),
                    container(
                        &[("cpu", "250m"), ("memory", "1Gi")],
                        &[("example.com/dev", "1")],
                    ),
                ],
                init_containers: Some(vec![init]),
                overhead: Some([("memory".to_owned(), q("1Mi"))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = pod_requests(&pod);
        assert_eq!(r.get("cpu"), Some(&2000), "init container max wins");
        assert_eq!(r.get("memory"), Some(&(((1 << 30) + (1 << 20)) * 1000)));
        assert_eq!(
            r.get("example.com/dev"),
            Some(&3000),
            "limits count as requests"
        );
    }

    #[test]
    fn huge_quantities_saturate_instead_of_overflowing() {
        // Each is about i128::MAX / 1000: the milli-units alone nearly fill an i128.
        let huge = "170141183460469231731687303715884105";
        let pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![
                    container(&[("cpu", huge)], &[]),
                    container(&[("cpu", huge)], &[]),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_requests(&pod).get("cpu"), Some(&(2 * MAX_MILLI)));
        assert_eq!(nonzero_cpu_memory(&pod).0, 2 * MAX_MILLI);
        // 39 digits of nano-units: the rounding step must not overflow.
        let nanos = format!("{}n", "9".repeat(39));
        let want = "9".repeat(33).parse::<i128>().expect("33 nines") + 1;
        assert_eq!(parse_quantity(&nanos), Ok(want));
        assert_eq!(milli(&q(&nanos)), MAX_MILLI);
        // More digits than any integer holds, tiny and huge exponents.
        assert_eq!(parse_quantity(&"9".repeat(80)), Ok(i128::MAX));
        assert_eq!(parse_quantity(&format!("0.{}1", "0".repeat(60))), Ok(1));
        assert_eq!(parse_quantity("1e99999999999"), Ok(i128::MAX));
        assert_eq!(parse_quantity("1e-99999999999"), Ok(1));
        assert_eq!(
            parse_quantity(&format!("-{}Ei", "9".repeat(30))),
            Ok(-i128::MAX)
        );
    }

    #[test]
    fn sidecar_init_containers_add() {
        let mut side = container(&[("cpu", "1")], &[]);
        side.restart_policy = Some("Always".into());
        let pod = Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![container(&[("cpu", "1")], &[])],
                init_containers: Some(vec![side, container(&[("cpu", "1500m")], &[])]),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Regular init after the sidecar: 1 + 1.5 = 2.5 > containers 1 + sidecar 1.
        assert_eq!(pod_requests(&pod).get("cpu"), Some(&2500));
    }
}
