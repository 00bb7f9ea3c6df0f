//! # Segments: memory obtained from the device in one piece
//!
//! A [`Segment`] is either a `malloc`'d range (PyTorch: one `cudaMalloc`) or an **expandable
//! segment**: a reserved virtual range, large enough for 1⅛ of the device's memory, into which
//! physical pages of `page_size` bytes are mapped as the pool grows and unmapped when whole pages
//! fall free (PyTorch: `ExpandableSegment`, Note [Expandable Segments]).
//!
//! Invariant: for an expandable segment, `pages[i]` is true iff the device has the page
//! `[base + i·page_size, +page_size)` mapped, and a mapped block covers only mapped pages.

use cudamem_device::{Device, DeviceError, StreamId};

use crate::block::{PoolId, SegmentId};

/// How a segment's memory is backed.
#[derive(Clone, Debug)]
pub enum Backing {
    /// One device allocation of the segment's size.
    Malloc,
    /// A reserved range with pages mapped on demand.
    Expandable {
        /// Bytes per page (a multiple of the device granularity).
        page_size: u64,
        /// Which pages are mapped.
        pages: Vec<bool>,
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
}

impl Segment {
    /// Whether pages are mapped on demand.
    pub fn is_expandable(&self) -> bool {
        matches!(self.backing, Backing::Expandable { .. })
    }

    /// Maps the pages touching `[ptr, ptr+size)` that are not mapped yet — PyTorch's
    /// `ExpandableSegment::map`: `ptr` is page aligned, the returned range covers whole pages.
    /// Returns the mapped range, or `Ok(None)` when the device ran out of memory (nothing stays
    /// mapped by this call then).
    pub fn map(&mut self, dev: &dyn Device, ptr: u64, size: u64) -> Result<Option<(u64, u64)>, DeviceError> {
        let Backing::Expandable { page_size, pages } = &mut self.backing else {
            unreachable!("map on a malloc segment")
        };
        let ps = *page_size;
        let begin = (ptr - self.base) / ps;
        let end = (ptr + size - self.base).div_ceil(ps);
        debug_assert_eq!(self.base + begin * ps, ptr, "map start must be page aligned");
        for i in begin..end {
            debug_assert!(!pages[i as usize], "page mapped twice");
            if let Err(e) = dev.map(self.base + i * ps, ps) {
                for j in begin..i {
                    dev.unmap(self.base + j * ps, ps)?;
                    pages[j as usize] = false;
                }
                return if e.is_out_of_memory() { Ok(None) } else { Err(e) };
            }
            pages[i as usize] = true;
        }
        Ok(Some((self.base + begin * ps, (end - begin) * ps)))
    }

    /// Unmaps the whole pages inside `[ptr, ptr+size)` — PyTorch's `ExpandableSegment::unmap`,
    /// which first waits for the segment's stream. Returns the unmapped range (size 0 if none).
    pub fn unmap(&mut self, dev: &dyn Device, ptr: u64, size: u64) -> Result<(u64, u64), DeviceError> {
        let Backing::Expandable { page_size, pages } = &mut self.backing else {
            unreachable!("unmap on a malloc segment")
        };
        let ps = *page_size;
        let begin = (ptr - self.base).div_ceil(ps);
        let end = (ptr + size - self.base) / ps;
        if begin >= end {
            return Ok((ptr, 0));
        }
        dev.synchronize_stream(self.stream)?;
        for i in begin..end {
            dev.unmap(self.base + i * ps, ps)?;
            pages[i as usize] = false;
        }
        Ok((self.base + begin * ps, (end - begin) * ps))
    }

    /// Bytes of mapped pages.
    pub fn mapped_bytes(&self) -> u64 {
        match &self.backing {
            Backing::Malloc => self.size,
            Backing::Expandable { page_size, pages } => pages.iter().filter(|p| **p).count() as u64 * page_size,
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
        self.slots.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (SegmentId(i as u32), s)))
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
