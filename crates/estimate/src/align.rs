//! Aligning the allocations of traces of one job recorded at different batch sizes.
//!
//! A trace's *signature* is its sequence of allocation events with the sizes left out: allocs
//! (with their stream, numbered by order of first use, since handles differ between processes),
//! frees naming the alloc they free (by its ordinal), frees of allocations made before
//! recording started, and cache releases (a run of `segment_free`/`segment_unmap`, as the replay
//! reads them). Equal signatures mean the job did the same thing at each size with different
//! sizes: the `k`-th alloc corresponds across traces, and the alignment is *exact*.
//!
//! Otherwise, when the signatures agree once *transient* allocations are left out (an alloc
//! freed before the device's next alloc: a kernel's workspace, an algorithm's trial buffer),
//! the other allocations correspond one to one, as in an exact alignment, and each transient
//! one is matched by its place: the number of other allocs before it, its site and its
//! occurrence number among the transients of that site at that place. This is the case of
//! jobs that pick kernels by size (cuDNN autotuning): at each batch size another algorithm may
//! need a workspace, or none, while the tensors the job keeps are the same.
//!
//! Failing that, each alloc of the base trace (the one at the largest batch) is matched to the alloc
//! with the same *site* and the same occurrence number of that site in each other trace. A site
//! is the stream ordinal, the recorded stack (hashed by content because stack ids are per trace)
//! and the lifetime class (short: fewer than 4 allocations made while it lived; long; never
//! freed): a short-lived workspace and the long-lived output of the same call are different
//! sites, so an extra workspace at one batch size (an algorithm that needs one) shifts only the
//! workspaces' numbering. An alloc with no counterpart in some trace is unmatched and keeps its
//! base size. Without recorded stacks a site is a stream and a lifetime class: the quality report
//! shows how much matched.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use cudamem_trace::{Action, DeviceTrace, Trace};

/// One event of a signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Alloc(u32),
    Free(u32),
    Done(u32),
    Unmatched,
    Release,
}

/// What one device trace reduces to.
struct Reduced {
    sig: Vec<Tok>,
    /// Requested size of each alloc, by ordinal.
    sizes: Vec<u64>,
    /// Site of each alloc, by ordinal: stream, stack hash, lifetime class.
    sites: Vec<(u32, u64, u32)>,
    /// For each event: the ordinal of the alloc it allocates or frees.
    owner: Vec<Option<u32>>,
    /// Whether each alloc, by ordinal, is transient (freed before the next alloc).
    transient: Vec<bool>,
}

fn stack_hash(t: &Trace, id: Option<u32>) -> u64 {
    let Some(s) = t.stack(id) else { return 0 };
    let mut h = DefaultHasher::new();
    for f in &s.frames {
        (&f.name, &f.filename, f.line).hash(&mut h);
    }
    h.finish() | 1
}

fn reduce(t: &Trace, dt: &DeviceTrace) -> Reduced {
    let mut r = Reduced {
        sig: Vec::new(),
        sizes: Vec::new(),
        sites: Vec::new(),
        owner: vec![None; dt.events.len()],
        transient: Vec::new(),
    };
    let mut streams: Vec<u64> = Vec::new();
    let mut live: HashMap<u64, u32> = HashMap::new();
    let mut pending: HashMap<u64, u32> = HashMap::new();
    let mut in_release = false;
    // Allocations made before each alloc and before its free, for the lifetime classes.
    let mut born: Vec<u64> = Vec::new();
    let mut lifetime: Vec<Option<u64>> = Vec::new();
    for (i, e) in dt.events.iter().enumerate() {
        let is_release = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        if is_release && !in_release {
            r.sig.push(Tok::Release);
        }
        in_release = is_release || (in_release && e.action == Action::Snapshot);
        match e.action {
            Action::Alloc => {
                let s = match streams.iter().position(|&x| x == e.stream) {
                    Some(p) => p as u32,
                    None => {
                        streams.push(e.stream);
                        streams.len() as u32 - 1
                    }
                };
                let k = r.sizes.len() as u32;
                r.sizes.push(e.size);
                r.sites.push((s, stack_hash(t, e.stack), 0));
                born.push(k as u64);
                lifetime.push(None);
                live.insert(e.addr, k);
                r.owner[i] = Some(k);
                r.sig.push(Tok::Alloc(s));
            }
            Action::FreeRequested => match live.remove(&e.addr) {
                Some(k) => {
                    lifetime[k as usize] = Some(r.sizes.len() as u64 - born[k as usize]);
                    r.owner[i] = Some(k);
                    pending.insert(e.addr, k);
                    r.sig.push(Tok::Free(k));
                }
                None => r.sig.push(Tok::Unmatched),
            },
            Action::FreeCompleted => {
                if let Some(k) = pending.remove(&e.addr) {
                    r.owner[i] = Some(k);
                    r.sig.push(Tok::Done(k));
                }
            }
            _ => {}
        }
    }
    r.transient = lifetime.iter().map(|l| *l == Some(1)).collect();
    for (site, life) in r.sites.iter_mut().zip(&lifetime) {
        // Coarse on purpose: an extra allocation inside a lifetime must not change its class.
        site.2 = match life {
            None => 2,
            Some(n) if *n < 4 => 0,
            Some(_) => 1,
        };
    }
    r
}

/// Where a transient alloc was made: the number of other allocs before it, its site, and its
/// occurrence number among the transient allocs of that site there.
type Place = (usize, (u32, u64, u32), usize);

impl Reduced {
    /// The signature without the transient allocs and their frees, allocs renumbered over the
    /// rest, and without cache releases (which the job may make a different number of times
    /// when it picks algorithms by size).
    fn core_sig(&self) -> Vec<Tok> {
        let mut ord = vec![u32::MAX; self.sizes.len()];
        let mut n = 0u32;
        for (k, t) in self.transient.iter().enumerate() {
            if !t {
                ord[k] = n;
                n += 1;
            }
        }
        let mut next = 0usize;
        let mut out = Vec::with_capacity(self.sig.len());
        for t in &self.sig {
            match *t {
                Tok::Alloc(s) => {
                    if !self.transient[next] {
                        out.push(Tok::Alloc(s));
                    }
                    next += 1;
                }
                Tok::Free(k) if !self.transient[k as usize] => out.push(Tok::Free(ord[k as usize])),
                Tok::Done(k) if !self.transient[k as usize] => out.push(Tok::Done(ord[k as usize])),
                Tok::Unmatched => out.push(Tok::Unmatched),
                _ => {}
            }
        }
        out
    }

    /// Each transient alloc's [`Place`] -> its ordinal; and the other allocs' ordinals in
    /// order.
    fn places(&self) -> (HashMap<Place, usize>, Vec<usize>) {
        let (mut places, mut core) = (HashMap::new(), Vec::new());
        let mut seen: HashMap<(usize, (u32, u64, u32)), usize> = HashMap::new();
        for (k, &t) in self.transient.iter().enumerate() {
            if t {
                let occ = seen.entry((core.len(), self.sites[k])).or_insert(0);
                places.insert((core.len(), self.sites[k], *occ), k);
                *occ += 1;
            } else {
                core.push(k);
            }
        }
        (places, core)
    }
}

/// How the allocations of the traces were matched, from the strongest to the weakest (the
/// order of the variants: the weakest of several devices is their maximum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AlignmentKind {
    /// Equal signatures: the `k`-th alloc of every trace corresponds.
    Exact,
    /// Equal signatures once transient allocs are left out: the others correspond one to one,
    /// the transient ones by their place.
    ExceptTransient,
    /// By call site and occurrence number.
    BySite,
}

impl AlignmentKind {
    /// How reports name it.
    pub fn label(self) -> &'static str {
        match self {
            AlignmentKind::Exact => "exact",
            AlignmentKind::ExceptTransient => "exact except transient allocations",
            AlignmentKind::BySite => "by call site",
        }
    }
}

/// The allocations of one device, aligned across the traces.
#[derive(Clone, Debug)]
pub struct DeviceAlignment {
    /// Device ordinal.
    pub device: i32,
    /// For each alloc of the base trace: its requested size in each trace (in the order the
    /// traces were given); an unmatched alloc has its base size everywhere.
    pub sizes: Vec<Vec<u64>>,
    /// Whether each alloc found a counterpart in every trace.
    pub matched: Vec<bool>,
    /// For each event of the base device trace: the alloc it allocates or frees.
    pub owner: Vec<Option<u32>>,
    /// Whether each alloc of the base trace is transient (freed before the device's next
    /// alloc).
    pub transient: Vec<bool>,
}

/// The allocations of all devices, aligned.
#[derive(Clone, Debug)]
pub struct Alignment {
    /// Index (in the order given) of the base trace: the one with the largest batch.
    pub base: usize,
    /// Per device, in the base trace's device order.
    pub devices: Vec<DeviceAlignment>,
    /// The weakest way any device's allocations were matched ([`AlignmentKind::Exact`]: every
    /// device's signatures were equal in all traces).
    pub kind: AlignmentKind,
}

impl Alignment {
    /// Allocations of the base trace, over all devices.
    pub fn allocations(&self) -> usize {
        self.devices.iter().map(|d| d.matched.len()).sum()
    }
    /// Allocations that found a counterpart in every trace.
    pub fn matched(&self) -> usize {
        self.devices
            .iter()
            .map(|d| d.matched.iter().filter(|m| **m).count())
            .sum()
    }
}

/// Aligns `traces` (each recorded at `batches[i]`); the base is the trace at the largest batch.
pub fn align(traces: &[&Trace], batches: &[u64]) -> Result<Alignment, String> {
    if traces.len() != batches.len() {
        return Err(format!(
            "{} traces but {} batch sizes: give one batch size per trace",
            traces.len(),
            batches.len()
        ));
    }
    if traces.len() < 2 {
        return Err("scaling needs traces at two or more batch sizes".into());
    }
    let mut sorted = batches.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!(
            "batch sizes {batches:?}: each trace needs a batch size of its own"
        ));
    }
    let base = (0..batches.len()).max_by_key(|&i| batches[i]).unwrap_or(0);
    let ordinals = |t: &Trace| {
        t.devices
            .iter()
            .filter(|d| !d.events.is_empty())
            .map(|d| d.device)
            .collect::<Vec<_>>()
    };
    let devs = ordinals(traces[base]);
    if devs.is_empty() {
        return Err(format!("{}: the trace has no events", traces[base].source));
    }
    for t in traces {
        if ordinals(t) != devs {
            return Err(format!(
                "{} has events on devices {:?} but {} on {:?}: the traces are not of the same job",
                t.source,
                ordinals(t),
                traces[base].source,
                devs
            ));
        }
    }
    let mut kind = AlignmentKind::Exact;
    let mut devices = Vec::new();
    for &d in &devs {
        let reduced: Vec<Reduced> = traces
            .iter()
            .map(|t| reduce(t, t.device(d).expect("device listed above")))
            .collect();
        let b = &reduced[base];
        if b.sizes.is_empty() {
            return Err(format!("{}: device {d} has no allocations", traces[base].source));
        }
        let n = b.sizes.len();
        let core = || {
            let bc = b.core_sig();
            reduced.iter().all(|r| r.core_sig() == bc)
        };
        let (sizes, matched) = if reduced.iter().all(|r| r.sig == b.sig) {
            let sizes = (0..n).map(|k| reduced.iter().map(|r| r.sizes[k]).collect()).collect();
            (sizes, vec![true; n])
        } else if core() {
            kind = kind.max(AlignmentKind::ExceptTransient);
            except_transient(&reduced, base)
        } else {
            kind = AlignmentKind::BySite;
            by_site(&reduced, base)
        };
        devices.push(DeviceAlignment {
            device: d,
            sizes,
            matched,
            owner: b.owner.clone(),
            transient: b.transient.clone(),
        });
    }
    Ok(Alignment { base, devices, kind })
}

/// Matching when the signatures agree without transient allocs (see the module doc).
fn except_transient(reduced: &[Reduced], base: usize) -> (Vec<Vec<u64>>, Vec<bool>) {
    let places: Vec<_> = reduced.iter().map(Reduced::places).collect();
    let b = &reduced[base];
    let (bplaces, bcore) = &places[base];
    let mut sizes = vec![Vec::new(); b.sizes.len()];
    let mut matched = vec![true; b.sizes.len()];
    for (i, &k) in bcore.iter().enumerate() {
        sizes[k] = reduced.iter().zip(&places).map(|(r, p)| r.sizes[p.1[i]]).collect();
    }
    for (key, &k) in bplaces {
        let row: Option<Vec<u64>> = reduced
            .iter()
            .zip(&places)
            .map(|(r, p)| p.0.get(key).map(|&j| r.sizes[j]))
            .collect();
        match row {
            Some(r) => sizes[k] = r,
            None => {
                sizes[k] = vec![b.sizes[k]; reduced.len()];
                matched[k] = false;
            }
        }
    }
    (sizes, matched)
}

/// Matching by site and occurrence number (see the module doc).
fn by_site(reduced: &[Reduced], base: usize) -> (Vec<Vec<u64>>, Vec<bool>) {
    let index: Vec<HashMap<(u32, u64, u32), Vec<u64>>> = reduced
        .iter()
        .map(|r| {
            let mut m: HashMap<(u32, u64, u32), Vec<u64>> = HashMap::new();
            for (site, size) in r.sites.iter().zip(&r.sizes) {
                m.entry(*site).or_default().push(*size);
            }
            m
        })
        .collect();
    let b = &reduced[base];
    let mut seen: HashMap<(u32, u64, u32), usize> = HashMap::new();
    let mut sizes = Vec::with_capacity(b.sizes.len());
    let mut matched = Vec::with_capacity(b.sizes.len());
    for (site, &own) in b.sites.iter().zip(&b.sizes) {
        let occ = seen.entry(*site).or_insert(0);
        let row: Option<Vec<u64>> = index
            .iter()
            .map(|m| m.get(site).and_then(|v| v.get(*occ)).copied())
            .collect();
        *occ += 1;
        match row {
            Some(r) => {
                sizes.push(r);
                matched.push(true);
            }
            None => {
                sizes.push(vec![own; reduced.len()]);
                matched.push(false);
            }
        }
    }
    (sizes, matched)
}
