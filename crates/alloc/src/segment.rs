//! # Segments: memory obtained from the device in one piece
//!
//! A [`Segment`] is either a `malloc`'d range (PyTorch: one `cudaMalloc`) or an **expandable
//! segment**: a reserved virtual range, large enough for 1⅛ of the device's memory, into which
//! physical pages of `page_size` bytes are mapped as the pool grows and unmapped when whole pages
//! fall free (PyTorch: `ExpandableSegment`, Note [Expandable Segments]).
//!
//! Invariant: for an expandable segment, `mappings` lists exactly the device mappings inside its
//! range, each starting and ending on a page boundary, and a mapped block covers only mapped
//! bytes. PyTorch's policy maps one page per mapping; a policy may map one mapping per growth
//! (fewer driver calls; such a mapping is unmapped only when wholly free).

use cudamem_device::{Device, DeviceError, StreamId};

use crate::block::{PoolId, SegmentId};

/// How a segment's memory is backed.
#[derive(Clone, Debug)]
pub enum Backing {
    /// One device allocation of the segment's size.
    Malloc,
    /// A reserved range into which physical allocations ("mappings") are mapped on demand.
    Expandable {
        /// Mappings start and end on multiples of this (a multiple of the device granularity).
        page_size: u64,
        /// Bytes per mapping when growing: `page_size` (one page per mapping, as PyTorch does),
        /// or more — a growth is then mapped in mappings of up to this size (fewer driver calls;
        /// each is unmapped only when wholly free).
        map_chunk: u64,
        /// The mappings, `(start address, bytes)`, sorted by address. Each is one device
        /// allocation, unmapped whole. (A sorted vector: growth appends at the end.)
        mappings: Vec<(u64, u64)>,
    },
}

/// One segment. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Segment {
    /// First address.
    pub base: u64,
    /// Bytes (for an expandable segment: of address space).
    pub size: u64,
    /// The pool whose blocks it holds.
    pub pool: PoolId,
    /// The stream it was created for.
    pub stream: StreamId,
    /// How it is backed.
    pub backing: Backing,
    /// Stack recorded when it was created (history), if any.
    pub stack: Option<u32>,
    /// Counted in `oversize_segments` (decided when it was created).
    pub oversize: bool,
}

impl Segment {
    /// Whether pages are mapped on demand.
    pub fn is_expandable(&self) -> bool {
        matches!(self.backing, Backing::Expandable { .. })
    }

    /// Maps `[ptr, ptr+size)` rounded out to whole pages, all of it unmapped so far — PyTorch's
    /// `ExpandableSegment::map` — in mappings of at most `first` bytes (`u64::MAX`: one
    /// mapping) when that is more than `map_chunk` (and in `map_chunk` ones after all if the
    /// device refuses the larger ones for lack of memory), of `map_chunk` bytes when `first` is
    /// 0, and of `first` bytes (at least a page) when it is less than `map_chunk`. Returns the
    /// mapped range, or `Ok(None)` when the device ran out of memory (nothing stays mapped by
    /// this call then).
    pub fn map(
        &mut self,
        dev: &dyn Device,
        ptr: u64,
        size: u64,
        first: u64,
    ) -> Result<Option<(u64, u64)>, DeviceError> {
        let base = self.base;
        let Backing::Expandable {
            page_size,
            map_chunk,
            mappings,
        } = &mut self.backing
        else {
            unreachable!("map on a malloc segment")
        };
        let ps = *page_size;
        debug_assert_eq!((ptr - base) % ps, 0, "map start must be page aligned");
        let end = base + (ptr + size - base).div_ceil(ps) * ps;
        let chunk = (*map_chunk).max(ps);
        if first > chunk && end - ptr > chunk {
            if let Some(r) = map_run(dev, mappings, ptr, end, first.min(end - ptr))? {
                return Ok(Some(r));
            } // refused for lack of memory: smaller mappings may still fit
        }
        let piece = match first {
            0 => chunk,
            f => f.clamp(ps, chunk) / ps * ps,
        };
        map_run(dev, mappings, ptr, end, piece)
    }

    /// Unmaps the mappings lying wholly inside `[ptr, ptr+size)` — PyTorch's
    /// `ExpandableSegment::unmap`, which first waits for the segment's stream. They form one
    /// contiguous run, which is returned (size 0 if none).
    pub fn unmap(&mut self, dev: &dyn Device, ptr: u64, size: u64) -> Result<(u64, u64), DeviceError> {
        let stream = self.stream;
        let Backing::Expandable {
            page_size,
            map_chunk,
            mappings,
        } = &mut self.backing
        else {
            unreachable!("unmap on a malloc segment")
        };
        let from = mappings.partition_point(|m| m.0 < ptr);
        let to = from
            + mappings[from..]
                .iter()
                .take_while(|&&(a, l)| a + l <= ptr + size)
                .count();
        let inside = &mappings[from..to];
        let Some(&(first, _)) = inside.first() else {
            return Ok((ptr, 0));
        };
        let total: u64 = inside.iter().map(|m| m.1).sum();
        dev.synchronize_stream(stream)?;
        if *map_chunk > *page_size {
            dev.unmap(first, total)?; // one call for the run, as cuMemUnmap allows
        } else {
            for &(a, l) in inside {
                dev.unmap(a, l)?; // PyTorch unmaps page by page
            }
        }
        mappings.drain(from..to);
        Ok((first, total))
    }

    /// Bytes of mapped memory.
    pub fn mapped_bytes(&self) -> u64 {
        match &self.backing {
            Backing::Malloc => self.size,
            Backing::Expandable { mappings, .. } => mappings.iter().map(|m| m.1).sum(),
        }
    }
}

/// Segments by [`SegmentId`], with slot reuse.
#[derive(Debug, Default)]
pub struct SegmentTable {
    slots: Vec<Option<Segment>>,
    vacant: Vec<u32>,
}

impl SegmentTable {
    /// Stores a segment.
    pub fn insert(&mut self, s: Segment) -> SegmentId {
        if let Some(i) = self.vacant.pop() {
            self.slots[i as usize] = Some(s);
            SegmentId(i)
        } else {
            self.slots.push(Some(s));
            SegmentId(self.slots.len() as u32 - 1)
        }
    }
    /// Removes a segment.
    pub fn remove(&mut self, id: SegmentId) -> Segment {
        let s = self.slots[id.0 as usize].take().expect("removing a dead segment");
        self.vacant.push(id.0);
        s
    }
    /// Live segments.
    pub fn iter(&self) -> impl Iterator<Item = (SegmentId, &Segment)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (SegmentId(i as u32), s)))
    }
}

impl std::ops::Index<SegmentId> for SegmentTable {
    type Output = Segment;
    fn index(&self, id: SegmentId) -> &Segment {
        self.slots[id.0 as usize].as_ref().expect("dead segment id")
    }
}
impl std::ops::IndexMut<SegmentId> for SegmentTable {
    fn index_mut(&mut self, id: SegmentId) -> &mut Segment {
        self.slots[id.0 as usize].as_mut().expect("dead segment id")
    }
}

/// Maps `[ptr, end)` in mappings of at most `largest` bytes, recording each in `mappings`
/// (sorted by address). On any failure the mappings this call made are undone; a lack of
/// memory is `Ok(None)`.
fn map_run(
    dev: &dyn Device,
    mappings: &mut Vec<(u64, u64)>,
    ptr: u64,
    end: u64,
    largest: u64,
) -> Result<Option<(u64, u64)>, DeviceError> {
    let mut at = ptr;
    while at < end {
        let chunk = largest.min(end - at);
        if let Err(e) = dev.map(at, chunk) {
            let from = mappings.partition_point(|m| m.0 < ptr);
            let to = mappings.partition_point(|m| m.0 < at);
            for &(a, l) in &mappings[from..to] {
                dev.unmap(a, l)?;
            }
            mappings.drain(from..to);
            return if e.is_out_of_memory() { Ok(None) } else { Err(e) };
        }
        let i = mappings.partition_point(|m| m.0 < at);
        mappings.insert(i, (at, chunk));
        at += chunk;
    }
    Ok(Some((ptr, end - ptr)))
}
