//! The bytes simulated memory holds: stored sparsely, only where they were written
//! ([`SimDevice::write`], `Device::copy_from_host`), in chunks of at most 4 KiB.
//!
//! Guarantees: unwritten bytes of backed memory read as zero; freeing a segment or unmapping pages
//! drops their bytes (so pages mapped anew read as zero, as fresh physical memory may on a GPU);
//! reads and writes must lie in backed memory (a live segment, or a contiguous run of mappings of
//! one reservation), anything else is `InvalidArgument`.

use super::{SimDevice, SimState};
use crate::{DeviceError, DevicePtr};

impl SimDevice {
    /// Bytes per stored chunk: 4 KiB, or less where the granularity is smaller, so that no
    /// chunk straddles two mappings.
    pub(super) fn chunk(&self) -> u64 {
        1 << self.config.granularity.trailing_zeros().min(12)
    }

    /// Writes `src` at `ptr` (a test's stand-in for a kernel writing device memory).
    pub fn write(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let mut s = self.lock();
        self.store(&mut s, ptr, src)
    }

    /// Reads `len` bytes at `ptr`; unwritten bytes read as zero.
    pub fn read(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::InvalidArgument(format!("read of {len} bytes")))?;
        let mut out = vec![0; len];
        let s = self.lock();
        self.load(&s, ptr, &mut out)?;
        Ok(out)
    }

    /// Bytes held in stored chunks (what the sparse byte store costs).
    pub fn stored_bytes(&self) -> u64 {
        self.lock().bytes.len() as u64 * self.chunk()
    }

    /// Whether `[ptr, ptr+len)` is backed now: inside one live segment, or covered by a
    /// contiguous run of mappings of one reservation.
    pub(super) fn backed(s: &SimState, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| DeviceError::InvalidArgument(format!("[{ptr:#x}, +{len}) wraps around")))?;
        if s.segments.iter().any(|(&a, &l)| a <= ptr && end <= a + l) {
            return Ok(());
        }
        if let Some((&base, r)) = s.reservations.range(..=ptr).next_back() {
            if end <= base + r.size {
                let mut at = ptr;
                let i = r.mappings.partition_point(|m| m.0 + m.1 <= ptr);
                for &(a, l) in &r.mappings[i..] {
                    if a > at || at >= end {
                        break;
                    }
                    at = a + l;
                }
                if at >= end {
                    return Ok(());
                }
            }
        }
        Err(DeviceError::InvalidArgument(format!(
            "[{ptr:#x}, +{len}) is not backed device memory of this device"
        )))
    }

    pub(super) fn store(&self, s: &mut SimState, ptr: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        Self::backed(s, ptr, src.len() as u64)?;
        let c = self.chunk();
        let mut done = 0usize;
        while done < src.len() {
            let at = ptr + done as u64;
            let (key, off) = (at / c, (at % c) as usize);
            let n = (c as usize - off).min(src.len() - done);
            let chunk = s
                .bytes
                .entry(key)
                .or_insert_with(|| vec![0; c as usize].into_boxed_slice());
            chunk[off..off + n].copy_from_slice(&src[done..done + n]);
            done += n;
        }
        Ok(())
    }

    pub(super) fn load(&self, s: &SimState, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        Self::backed(s, ptr, dst.len() as u64)?;
        let c = self.chunk();
        let mut done = 0usize;
        while done < dst.len() {
            let at = ptr + done as u64;
            let (key, off) = (at / c, (at % c) as usize);
            let n = (c as usize - off).min(dst.len() - done);
            match s.bytes.get(&key) {
                Some(chunk) => dst[done..done + n].copy_from_slice(&chunk[off..off + n]),
                None => dst[done..done + n].fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Drops the stored bytes of `[ptr, ptr+len)` (its memory was released).
    pub(super) fn forget(&self, s: &mut SimState, ptr: DevicePtr, len: u64) {
        let c = self.chunk();
        let keys: Vec<u64> = s
            .bytes
            .range(ptr / c..(ptr + len).div_ceil(c))
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            s.bytes.remove(&k);
        }
    }
}
