//! Hot-path costs of the vGPU library's own parts, without interception:
//! charge + uncharge on the shared region, and insert + remove in the
//! allocation table with 1 and 1000 other live allocations.
//!
//! `cargo bench -p tessera-vgpu --bench accounting`; `cargo test -p
//! tessera-vgpu --benches` runs each once as a smoke test. Budget (the
//! interception adds its own): ≤ 30 ns for each pair, uncontended.

use divan::{Bencher, black_box};
use tessera_vgpu::accounting::{self, SharedRegion};
use tessera_vgpu::alloc_table::{self, AllocTable};

fn main() {
    divan::main();
}

/// Device pointers as the driver hands them out: 2 MiB apart.
fn ptr(i: u64) -> u64 {
    0x7f40_0000_0000 + (i << 21)
}

/// A fresh region with one device, its file made as the node side makes it
/// (in a directory removed on drop).
fn temp_region() -> (tempfile::TempDir, SharedRegion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("vgpu.accounting");
    accounting::create_file(&path).expect("region file");
    let region = SharedRegion::open(&path, 1).expect("open region");
    (dir, region)
}

/// Inserts `live` allocations of 1 MiB at `ptr(base)` on into `table`.
fn fill(table: &AllocTable, base: u64, live: u64) {
    for i in 0..live {
        table.insert(ptr(base + i), 0, 1 << 20, 0);
    }
}

/// Indexes past the `live` ones, cycling through 4096 so that each
/// iteration is a different key.
fn cycle(live: u64) -> impl FnMut() -> u64 {
    let mut next = live;
    move || {
        let i = next;
        next = if next >= live + 4096 { live } else { next + 1 };
        i
    }
}

#[divan::bench(threads = [1, 2])]
fn charge_uncharge(bencher: Bencher) {
    let (_dir, region) = temp_region();
    bencher.bench(|| {
        let charged = region.try_charge(0, black_box(1 << 20), black_box(u64::MAX / 2));
        region.uncharge(0, black_box(1 << 20));
        charged
    });
}

#[divan::bench]
fn charge_refused_at_limit(bencher: Bencher) {
    let (_dir, region) = temp_region();
    assert!(region.try_charge(0, 1 << 30, 1 << 30));
    bencher.bench_local(|| region.try_charge(0, black_box(1 << 20), black_box(1 << 30)));
}

#[divan::bench(args = [1, 1000])]
fn table_insert_remove(bencher: Bencher, live: u64) {
    let table = AllocTable::new();
    fill(&table, 0, live);
    let mut next = cycle(live);
    bencher.bench_local(|| {
        let p = ptr(next());
        table.insert(black_box(p), 0, 1 << 20, 0);
        table.remove(black_box(p))
    });
}

#[divan::bench(args = [1, 1000])]
fn global_table_insert_remove(bencher: Bencher, live: u64) {
    let table = alloc_table::global();
    let base = 1 << 30;
    fill(table, base, live);
    let mut next = cycle(live);
    bencher.bench_local(|| {
        let p = ptr(base + next());
        table.insert(black_box(p), 0, 1 << 20, 0);
        table.remove(black_box(p))
    });
    for i in 0..live {
        table.remove(ptr(base + i));
    }
}

/// The whole of what the allocation path adds: charge, record; then the free
/// path: look up, uncharge.
#[divan::bench(args = [1, 1000])]
fn alloc_free_bookkeeping(bencher: Bencher, live: u64) {
    let (_dir, region) = temp_region();
    let table = AllocTable::new();
    fill(&table, 0, live);
    let mut next = cycle(live);
    bencher.bench_local(|| {
        let p = ptr(next());
        if region.try_charge(0, 1 << 20, u64::MAX / 2) {
            table.insert(black_box(p), 0, 1 << 20, 0);
        }
        if let Some(entry) = table.remove(black_box(p)) {
            region.uncharge(entry.device as usize, entry.bytes);
        }
    });
}

/// Reference points for reading the figures above on any machine: the
/// floor of charge + uncharge is four locked read-modify-writes (the total
/// and the process's slot, on each side); of insert + remove, two lock
/// acquisitions plus the map work.
mod reference {
    use divan::black_box;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[divan::bench]
    fn four_locked_adds() -> u64 {
        static A: AtomicU64 = AtomicU64::new(0);
        static B: AtomicU64 = AtomicU64::new(0);
        A.fetch_add(black_box(1), Ordering::Relaxed);
        B.fetch_add(black_box(1), Ordering::Relaxed);
        B.fetch_sub(black_box(1), Ordering::Relaxed);
        A.fetch_sub(black_box(1), Ordering::Relaxed)
    }

    #[divan::bench]
    fn std_mutex_hashmap_insert_remove(bencher: divan::Bencher) {
        let map = std::sync::Mutex::new(HashMap::<u64, (u64, u32, u8)>::new());
        let mut next = 0u64;
        bencher.bench_local(|| {
            next = (next + 1) & 4095;
            let p = 0x7f40_0000_0000 + (next << 21);
            map.lock().expect("lock").insert(black_box(p), (1, 0, 0));
            map.lock().expect("lock").remove(&black_box(p))
        });
    }
}
