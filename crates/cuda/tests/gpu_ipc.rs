//! GPU tests of CUDA IPC on [`CudaDevice`]: exporting mapped memory and importing it again, in
//! this process (pidfd_getfd of one's own pid is allowed), so that one test process checks both
//! halves; sharing between two processes is checked by the torch suite
//! (`scripts/gpu/torch/native_check.py`). Without a CUDA device each test prints
//! `SKIPPED: no CUDA device (<reason>)` and returns; `CUDAMEM_REQUIRE_GPU=1` makes that a failure.

use cudamem_cuda::{CudaDevice, Device, DeviceError};
use cudamem_device::ipc::ImportedPart;

fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var_os("CUDAMEM_REQUIRE_GPU").is_some_and(|v| v != "0") {
                panic!("CUDAMEM_REQUIRE_GPU is set but no CUDA device could be opened: {e}");
            }
            eprintln!("SKIPPED: no CUDA device ({e})");
            None
        }
    }
}

#[test]
fn exported_mappings_import_to_the_same_bytes() {
    let Some(d) = gpu() else { return };
    let g = d.granularity();
    let base = d.reserve(8 * g).unwrap();
    d.map(base, 3 * g).unwrap();
    d.map(base + 3 * g, g).unwrap();
    let bytes: Vec<u8> = (0..4 * g).map(|i| (i * 7 % 251) as u8).collect();
    d.copy_from_host(base, &bytes).unwrap();

    let ex = d.export_mappings(base + g, 3 * g).unwrap();
    assert_eq!(ex.len(), 2, "both mappings cover [base+g, +3g): {ex:?}");
    assert_eq!(
        (ex[0].start, ex[0].size, ex[1].start, ex[1].size),
        (base, 3 * g, base + 3 * g, g)
    );
    assert_eq!(
        d.export_mappings(base, g).unwrap()[0].fd,
        ex[0].fd,
        "one descriptor per mapping"
    );

    let parts: Vec<ImportedPart> = ex.iter().map(|m| ImportedPart { size: m.size, fd: m.fd }).collect();
    let imported = d.import_mappings(std::process::id() as i32, &parts).unwrap();
    assert_ne!(imported, base);
    let mut back = vec![0u8; (4 * g) as usize];
    // The imported range is not this device's own memory: read it with a raw copy, in the
    // device's context.
    let r = d
        .with_current(|| {
            // SAFETY: `[imported, +4g)` was just mapped readable for this device; `back` holds 4g
            // bytes; the device's context is current in this closure.
            unsafe {
                cudamem_cuda::cudarc::driver::sys::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), imported, back.len())
            }
        })
        .unwrap();
    cudamem_cuda::check(r, "cuMemcpyDtoH").unwrap();
    assert!(back == bytes, "the imported range holds the exported bytes");

    // The sender may unmap first: the physical memory lives on in the import.
    d.unmap(base, 3 * g).unwrap();
    d.unmap(base + 3 * g, g).unwrap();
    d.release_reservation(base, 8 * g).unwrap();
    d.release_imported(imported).unwrap();
    assert!(matches!(
        d.release_imported(imported),
        Err(DeviceError::InvalidArgument(_))
    ));
}

#[test]
fn wrong_ipc_arguments_are_refused_before_the_driver() {
    let Some(d) = gpu() else { return };
    let g = d.granularity();
    for r in [
        d.export_mappings(0x1000, g).map(|_| ()),
        d.ipc_handle(0x1000).map(|_| ()),
        d.close_ipc_handle(0x1000),
        d.release_imported(0x1000),
        d.import_mappings(std::process::id() as i32, &[]).map(|_| ()),
        d.import_mappings(std::process::id() as i32, &[ImportedPart { size: g / 2, fd: 0 }])
            .map(|_| ()),
    ] {
        assert!(matches!(r, Err(DeviceError::InvalidArgument(_))), "{r:?}");
    }
    let seg = d.malloc(g).unwrap();
    let h = d.ipc_handle(seg).unwrap();
    assert!(h.iter().any(|&b| b != 0));
    // CUDA does not let a process open its own IPC handle; whatever the driver answers, an
    // opened one closes and a refusal names the call.
    match d.open_ipc_handle(&h) {
        Ok(p) => d.close_ipc_handle(p).unwrap(),
        Err(e) => assert!(
            matches!(
                e,
                DeviceError::Driver {
                    call: "cuIpcOpenMemHandle",
                    ..
                }
            ),
            "{e:?}"
        ),
    }
    d.free(seg, g).unwrap();
}
