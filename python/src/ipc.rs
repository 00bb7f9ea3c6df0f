//! # CUDA tensors between processes: torch's shareable handles
//!
//! `torch.multiprocessing` sends a CUDA tensor as the bytes the allocator's `shareIpcHandle`
//! returns, plus the tensor's offset in the memory they describe; the receiving process's
//! allocator turns the bytes back into an address with `getIpcDevPtr`. These are the bytes, in
//! PyTorch's layout (`SHAREABLE_HANDLE_VERSION` 2), so that cudamem and torch's own allocator
//! understand each other:
//!
//! | type | after the version byte and the type byte |
//! |------|------------------------------------------|
//! | `c` (torch's) | the 64-byte `cudaIpcMemHandle_t` of a whole segment |
//! | `e` (torch's expandable segments) | `{pid: i32, 0: i32, segment_size: u64, count: u64}`, then `count` descriptors (`i32`) of physical allocations of `segment_size` bytes each |
//! | `v` (cudamem's) | `{pid: i32, 0: i32, count: u64}`, then `count` × `{size: u64, fd: i32, 0: i32}` |
//!
//! A bare 64-byte handle (no version) is torch's oldest `c`. cudamem writes `c` for memory of a
//! whole segment, `e` for mapped memory whose physical allocations all have one size (torch's
//! allocator can open those), and `v` otherwise (only cudamem opens it; torch's allocator says
//! "unexpected or illformed shareable handle type"). Integers are little-endian, as on every
//! machine torch's CUDA build runs on. Padding is zero, because receivers cache by the bytes.

use cudamem_alloc::Shared;
use cudamem_device::ipc::{ImportedPart, IPC_HANDLE_SIZE};

/// The version byte cudamem writes (PyTorch's `SHAREABLE_HANDLE_VERSION`).
pub const VERSION: u8 = 2;

/// What a handle asks the receiver to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handle {
    /// A whole segment, by its IPC handle.
    Segment([u8; IPC_HANDLE_SIZE]),
    /// Physical allocations of process `pid`, to be mapped contiguously in order.
    Mapped {
        /// The sender's pid (the descriptors are its own).
        pid: i32,
        /// Sizes and the sender's descriptors.
        parts: Vec<ImportedPart>,
    },
}

/// The bytes for `shared`, sent by process `pid`, and the allocation's offset in what they
/// describe (`ptr` is the allocation's address).
pub fn encode(shared: &Shared, ptr: u64, pid: i32) -> (Vec<u8>, u64) {
    let mut out = vec![VERSION];
    match shared {
        Shared::Segment { base, handle, .. } => {
            out.push(b'c');
            out.extend_from_slice(handle);
            (out, ptr - base)
        }
        Shared::Mapped { mappings } => {
            let first = mappings.first().map_or(ptr, |m| m.start);
            let one_size = mappings.windows(2).all(|w| w[0].size == w[1].size);
            let head = |out: &mut Vec<u8>| {
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&0i32.to_le_bytes());
            };
            if one_size && !mappings.is_empty() {
                out.push(b'e');
                head(&mut out);
                out.extend_from_slice(&mappings[0].size.to_le_bytes());
                out.extend_from_slice(&(mappings.len() as u64).to_le_bytes());
                for m in mappings {
                    out.extend_from_slice(&m.fd.to_le_bytes());
                }
            } else {
                out.push(b'v');
                head(&mut out);
                out.extend_from_slice(&(mappings.len() as u64).to_le_bytes());
                for m in mappings {
                    out.extend_from_slice(&m.size.to_le_bytes());
                    out.extend_from_slice(&m.fd.to_le_bytes());
                    out.extend_from_slice(&0i32.to_le_bytes());
                }
            }
            (out, ptr - first)
        }
    }
}

/// Reads handle bytes from a sender (cudamem or torch). Errors name what is wrong.
pub fn decode(bytes: &[u8]) -> Result<Handle, String> {
    if bytes.len() == IPC_HANDLE_SIZE {
        return Ok(Handle::Segment(bytes.try_into().expect("length checked")));
    }
    let mut r = Reader { bytes, at: 0 };
    let version = r.u8()?;
    if version > VERSION {
        return Err(format!(
            "the CUDA IPC handle has version {version}, newer than the {VERSION} cudamem reads \
             (the sender runs a newer torch)"
        ));
    }
    let handle = match r.u8()? {
        b'c' => Handle::Segment(r.take(IPC_HANDLE_SIZE)?.try_into().expect("length checked")),
        b'e' => {
            let pid = r.pid()?;
            let size = r.u64()?;
            let count = r.count(4)?;
            let parts = (0..count)
                .map(|_| Ok(ImportedPart { size, fd: r.i32()? }))
                .collect::<Result<_, String>>()?;
            Handle::Mapped { pid, parts }
        }
        b'v' => {
            let pid = r.pid()?;
            let count = r.count(16)?;
            let mut parts = Vec::with_capacity(count);
            for _ in 0..count {
                let size = r.u64()?;
                let fd = r.i32()?;
                r.i32()?;
                parts.push(ImportedPart { size, fd });
            }
            Handle::Mapped { pid, parts }
        }
        t => return Err(format!("unknown CUDA IPC handle type {:?}", t as char)),
    };
    if r.at != bytes.len() {
        return Err(format!(
            "the CUDA IPC handle has {} bytes after its end",
            bytes.len() - r.at
        ));
    }
    Ok(handle)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "the CUDA IPC handle is truncated ({} bytes; more were expected)",
                    self.bytes.len()
                )
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn pid(&mut self) -> Result<i32, String> {
        let pid = self.i32()?;
        self.i32()?; // padding
        if pid <= 0 {
            return Err(format!("the CUDA IPC handle names process {pid}"));
        }
        Ok(pid)
    }
    /// A count of items of `item` bytes each that must fit in what is left.
    fn count(&mut self, item: usize) -> Result<usize, String> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.at) / item;
        if n == 0 || n as usize > left {
            return Err(format!("the CUDA IPC handle lists {n} allocations but holds {left}"));
        }
        Ok(n as usize)
    }
}

// ---------------------------------------------------------------------------------------------
// The native class's entries (see `crate::native`): shareIpcHandle, getIpcDevPtr and the
// deleter of what getIpcDevPtr returned.
// ---------------------------------------------------------------------------------------------

use std::ffi::{c_int, c_void};

use cudamem_alloc::AllocError;

use crate::abi::ByteSink;
use crate::entry::{alloc, owner_of};
use crate::guard::{run, CError, ERR_INVALID};

/// What [`nat_ipc_open`] opened, for [`nat_ipc_close`].
const OPENED_SEGMENT: c_int = 1;
const IMPORTED_MAPPINGS: c_int = 2;

/// `(ptr, ctx, sink, offset_out) -> kind`: the handle bytes of allocation `ptr` (to `sink`)
/// and its offset in the memory they describe.
pub(crate) unsafe extern "C" fn nat_ipc_share(
    ptr: *mut c_void,
    ctx: *mut c_void,
    sink: ByteSink,
    offset: *mut u64,
) -> c_int {
    let mut out = None;
    let kind = run("share_ipc_handle", || {
        let p = ptr as u64;
        let (_, a) = owner_of(p).ok_or_else(|| CError {
            kind: ERR_INVALID,
            message: format!("cannot share {p:#x} with another process: cudamem did not allocate it"),
        })?;
        let shared = a.raw()?.share(p)?;
        out = Some(encode(&shared, p, std::process::id() as i32));
        Ok(())
    });
    if let Some((bytes, off)) = out {
        // SAFETY: the caller passes a writable u64 and a sink that copies the bytes.
        unsafe {
            *offset = off;
            sink(ctx, bytes.as_ptr(), bytes.len());
        }
    }
    kind
}

/// `(device, bytes, len, ptr_out, kind_out) -> kind`: maps what a handle describes on `device`.
pub(crate) unsafe extern "C" fn nat_ipc_open(
    device: c_int,
    bytes: *const u8,
    len: usize,
    ptr: *mut u64,
    opened: *mut c_int,
) -> c_int {
    run("get_ipc_dev_ptr", || {
        // SAFETY: the caller passes `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(bytes, len) };
        let handle = decode(bytes).map_err(|message| CError {
            kind: ERR_INVALID,
            message,
        })?;
        let dev = alloc(device)?.device();
        let (p, k) = match handle {
            Handle::Segment(h) => (dev.open_ipc_handle(&h), OPENED_SEGMENT),
            Handle::Mapped { pid, parts } => (dev.import_mappings(pid, &parts), IMPORTED_MAPPINGS),
        };
        let p = p.map_err(|e| CError::from(AllocError::Device(e)))?;
        // SAFETY: the caller passes writable out-values.
        unsafe {
            *ptr = p;
            *opened = k;
        }
        Ok(())
    })
}

/// `(device, ptr, kind) -> kind`: lets go of what [`nat_ipc_open`] returned.
pub(crate) extern "C" fn nat_ipc_close(device: c_int, ptr: u64, opened: c_int) -> c_int {
    run("close_ipc_dev_ptr", || {
        let dev = alloc(device)?.device();
        let r = match opened {
            OPENED_SEGMENT => dev.close_ipc_handle(ptr),
            IMPORTED_MAPPINGS => dev.release_imported(ptr),
            k => {
                return Err(CError {
                    kind: ERR_INVALID,
                    message: format!("close of {ptr:#x}: unknown IPC kind {k}"),
                })
            }
        };
        r.map_err(|e| CError::from(AllocError::Device(e)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudamem_device::ipc::ExportedMapping;

    fn mapping(start: u64, size: u64, fd: i32) -> ExportedMapping {
        ExportedMapping { start, size, fd }
    }

    #[test]
    fn a_segment_is_torchs_c_layout_and_reads_back() {
        let handle = [7u8; IPC_HANDLE_SIZE];
        let shared = Shared::Segment {
            base: 0x1000,
            size: 1 << 20,
            handle,
        };
        let (bytes, offset) = encode(&shared, 0x1200, 42);
        assert_eq!(offset, 0x200);
        assert_eq!(bytes.len(), 2 + IPC_HANDLE_SIZE);
        assert_eq!(&bytes[..2], &[2, b'c']);
        assert_eq!(decode(&bytes).unwrap(), Handle::Segment(handle));
        assert_eq!(
            decode(&handle).unwrap(),
            Handle::Segment(handle),
            "torch's oldest: a bare handle"
        );
    }

    #[test]
    fn equal_mappings_are_torchs_e_layout() {
        let g = 2 << 20;
        let shared = Shared::Mapped {
            mappings: vec![mapping(0x4000_0000, g, 11), mapping(0x4000_0000 + g, g, 12)],
        };
        let (bytes, offset) = encode(&shared, 0x4000_0000 + 4096, 99);
        assert_eq!(offset, 4096);
        // torch's ShareHeader {pid_t pid; size_t segment_size; size_t num_handles;}: 24 bytes.
        assert_eq!(bytes.len(), 2 + 24 + 2 * 4);
        assert_eq!(bytes[1], b'e');
        assert_eq!(&bytes[2..6], &99i32.to_le_bytes());
        assert_eq!(&bytes[6..10], &[0; 4], "padding is zero: receivers cache by the bytes");
        let parts = vec![ImportedPart { size: g, fd: 11 }, ImportedPart { size: g, fd: 12 }];
        assert_eq!(decode(&bytes).unwrap(), Handle::Mapped { pid: 99, parts });
    }

    #[test]
    fn mixed_mappings_are_cudamems_v_layout() {
        let g = 2 << 20;
        let shared = Shared::Mapped {
            mappings: vec![mapping(0x10_0000_0000, 3 * g, 5), mapping(0x10_0000_0000 + 3 * g, g, 6)],
        };
        let (bytes, offset) = encode(&shared, 0x10_0000_0000 + 3 * g, 7);
        assert_eq!(offset, 3 * g);
        assert_eq!(bytes[1], b'v');
        let parts = vec![ImportedPart { size: 3 * g, fd: 5 }, ImportedPart { size: g, fd: 6 }];
        assert_eq!(decode(&bytes).unwrap(), Handle::Mapped { pid: 7, parts });
    }

    #[test]
    fn malformed_handles_are_refused_with_a_reason() {
        let g = 2u64 << 20;
        let good = encode(
            &Shared::Mapped {
                mappings: vec![mapping(0, g, 3), mapping(g, g, 4)],
            },
            0,
            5,
        )
        .0;
        for (bytes, why) in [
            (vec![], "truncated"),
            (vec![3, b'c'], "newer"),
            (vec![2, b'x'], "unknown"),
            (vec![2, b'c', 1, 2], "truncated"),
            (good[..good.len() - 1].to_vec(), "holds"),
            ([good.clone(), vec![0]].concat(), "after its end"),
            (
                [vec![2, b'e'], 0i32.to_le_bytes().to_vec(), vec![0; 20]].concat(),
                "process 0",
            ),
        ] {
            let e = decode(&bytes).unwrap_err();
            assert!(e.contains(why), "{bytes:?}: {e}");
        }
    }
}
