//! # The process-global registry of per-device allocators
//!
//! One allocator per device ordinal (a [`cudamem::Allocator`], the Rust API's; this package
//! reaches it only through that type's public API and its narrow handles), created on first use and then kept for the rest
//! of the process (never dropped: PyTorch frees tensors during interpreter shutdown, and those
//! frees must still find their allocator). Allocators never share memory: a block of device 1 is
//! never handed to device 0.
//!
//! * **Lookup is lock-free**: the allocators live in a fixed array of `OnceLock`s indexed by
//!   ordinal ([`MAX_DEVICES`] slots). Creation is serialised by one mutex, so two threads
//!   allocating on a new device at once create it once.
//! * **The device** is `cudamem_cuda::CudaDevice::new(ordinal)`, or a simulated GPU when the
//!   environment variable `CUDAMEM_DEVICE` is `sim` (an H200's capacity) or `sim:<size>`
//!   (`sim:8GiB`, `sim:80GB`, `sim:1073741824`: the Rust API's device strings, without an
//!   ordinal), or `auto` without a CUDA device. The variable is read when an allocator is
//!   created. The simulated device is what CI tests use; it needs no GPU.
//! * **The configuration** is [`AllocatorConfig::from_env`] (`CUDAMEM_ALLOC_CONF`, else
//!   `PYTORCH_CUDA_ALLOC_CONF`, ...) and the policy `CUDAMEM_POLICY` (default `cudamem`), unless
//!   [`configure`] set either before the first allocator was created.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudamem::{Allocator, Raw, TraceObserver};
use cudamem::{DeviceSpec, OpenedDevice};
use cudamem_alloc::{AllocError, AllocatorConfig};
use cudamem_device::sim::{SimConfig, SimDevice, H200_CAPACITY};
use cudamem_device::DeviceError;

/// The number of device ordinals the registry serves (0 .. MAX_DEVICES).
pub use crate::recording::MAX_DEVICES;

/// The policy used when neither [`configure`] nor `CUDAMEM_POLICY` names one.
pub const DEFAULT_POLICY: &str = "cudamem";

static SLOTS: [OnceLock<Entry>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
/// Each slot's pointer-level handle, taken once when its allocator is created: malloc and free
/// read it with one atomic load instead of asking the allocator for it on every call.
static RAWS: [OnceLock<Raw<'static>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// One device's allocator and the policy name it was created with (as asked for:
/// `pytorch-expandable` is the `pytorch` policy with expandable segments).
struct Entry {
    alloc: Allocator,
    policy: String,
}

impl Entry {
    fn allocator(&self) -> &Allocator {
        &self.alloc
    }
}
static CREATE: Mutex<()> = Mutex::new(());
/// How many allocators exist, and the ordinal of the first: with one, a free needs no search.
static CREATED: AtomicUsize = AtomicUsize::new(0);
static FIRST: AtomicI32 = AtomicI32::new(-1);
static OVERRIDES: Mutex<Overrides> = Mutex::new(Overrides {
    policy: None,
    config: None,
    runtime: Vec::new(),
});

#[derive(Clone, Debug)]
struct Overrides {
    policy: Option<String>,
    config: Option<String>,
    /// Settings changed at run time ([`set_settings_everywhere`]), applied in order over the
    /// configuration of allocators created later.
    runtime: Vec<String>,
}

/// Why the registry could not produce an allocator.
#[derive(Debug)]
pub enum RegistryError {
    /// The ordinal is negative or not below [`MAX_DEVICES`].
    BadDevice(String),
    /// A configuration string, policy name or `CUDAMEM_DEVICE` value was rejected.
    BadSetting(String),
    /// The device could not be opened (no driver, no such GPU, ...).
    Device(DeviceError),
    /// [`configure`] came after an allocator had been created.
    InUse(String),
    /// The allocator refused the request.
    Alloc(AllocError),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::BadDevice(m) | RegistryError::BadSetting(m) | RegistryError::InUse(m) => f.write_str(m),
            RegistryError::Device(e) => write!(
                f,
                "cudamem: cannot open the device: {e} (without a GPU, CUDAMEM_DEVICE=sim selects cudamem's simulated one)"
            ),
            RegistryError::Alloc(e) => e.fmt(f),
        }
    }
}

impl From<AllocError> for RegistryError {
    fn from(e: AllocError) -> Self {
        RegistryError::Alloc(e)
    }
}

impl From<cudamem::Error> for RegistryError {
    fn from(e: cudamem::Error) -> Self {
        match e {
            cudamem::Error::Alloc(a) => RegistryError::Alloc(a),
            other => RegistryError::BadSetting(other.to_string()),
        }
    }
}

/// Checks an ordinal and turns it into a slot index.
pub fn slot_index(device: i32) -> Result<usize, RegistryError> {
    if device < 0 || device as usize >= MAX_DEVICES {
        return Err(RegistryError::BadDevice(format!(
            "invalid device {device}: device must be an ordinal in [0, {MAX_DEVICES})"
        )));
    }
    Ok(device as usize)
}

/// The allocator of `device` if it was created already (never creates one).
pub fn get(device: i32) -> Option<&'static Allocator> {
    let i = usize::try_from(device).ok()?;
    SLOTS.get(i)?.get().map(Entry::allocator)
}

/// The pointer-level handle of `device`'s allocator if it was created already.
#[inline]
pub fn raw(device: i32) -> Option<Raw<'static>> {
    RAWS.get(usize::try_from(device).ok()?)?.get().copied()
}

/// The policy name `device`'s allocator was created with, if it exists.
pub fn policy_of(device: i32) -> Option<&'static str> {
    let i = usize::try_from(device).ok()?;
    SLOTS.get(i)?.get().map(|e| e.policy.as_str())
}

/// The allocator of `device`, created on first use.
pub fn get_or_create(device: i32) -> Result<&'static Allocator, RegistryError> {
    let i = slot_index(device)?;
    if let Some(e) = SLOTS[i].get() {
        return Ok(e.allocator());
    }
    let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = SLOTS[i].get() {
        return Ok(e.allocator());
    }
    let (config, policy) = effective_settings()?;
    let dev = open_device(device)?;
    let alloc = Allocator::on_device(dev, config, &policy).map_err(|e| RegistryError::BadSetting(e.to_string()))?;
    // Memory history set for every device (record_memory_history(device=None)) applies to
    // allocators created later too; under CREATE, so that no setting is missed.
    crate::recording::on_new_allocator(device, &alloc)?;
    if let Some(o) = lock_observer().clone() {
        alloc.history()?.set_trace_observer(Some(o));
    }
    let _ = SLOTS[i].set(Entry { alloc, policy });
    if let Some(Ok(raw)) = SLOTS[i].get().map(|e| e.alloc.raw()) {
        let _ = RAWS[i].set(raw); // always: the registry refuses sharded:True
    }
    if CREATED.load(Ordering::Relaxed) == 0 {
        FIRST.store(device, Ordering::Relaxed);
    }
    CREATED.fetch_add(1, Ordering::Release); // after the slot is set: `sole` reads it
    SLOTS[i]
        .get()
        .map(Entry::allocator)
        .ok_or_else(|| RegistryError::BadSetting(format!("cudamem: the allocator of device {device} was not kept")))
}

/// The observer of every allocator's events, existing and future (torch's trace trackers and
/// torch's own history, see `crate::trackers`).
static TRACE_OBSERVER: Mutex<Option<TraceObserver>> = Mutex::new(None);

fn lock_observer() -> std::sync::MutexGuard<'static, Option<TraceObserver>> {
    TRACE_OBSERVER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes `observer` (or, with `None`, nobody) hear the events of every allocator, those that
/// exist and those created later.
pub fn set_trace_observer(observer: Option<TraceObserver>) {
    let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    *lock_observer() = observer.clone();
    for (_, a) in existing() {
        // Every allocator here has its history: the registry refuses sharded:True.
        if let Ok(h) = a.history() {
            h.set_trace_observer(observer.clone());
        }
    }
}

/// Runs `f` while no allocator can be created (for settings that must reach every allocator,
/// existing or new). `f` must not create allocators.
pub fn with_creation_locked<R>(f: impl FnOnce() -> R) -> R {
    let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    f()
}

/// The allocator, when exactly one exists (the common one-GPU process), with its ordinal.
#[inline]
pub fn sole() -> Option<(i32, &'static Allocator)> {
    if CREATED.load(Ordering::Acquire) != 1 {
        return None;
    }
    let d = FIRST.load(Ordering::Relaxed);
    get(d).map(|a| (d, a))
}

/// Every allocator created so far, with its ordinal, in ordinal order.
pub fn existing() -> impl Iterator<Item = (i32, &'static Allocator)> {
    SLOTS
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.get().map(|e| (i as i32, e.allocator())))
}

/// Sets the policy and/or configuration string for the allocators still to be created.
/// Both are validated first (a bad one is [`RegistryError::BadSetting`], whatever the state);
/// then, if any allocator exists already, the call is [`RegistryError::InUse`]. `None` keeps
/// what was there (the environment, unless an earlier call set it).
pub fn configure(policy: Option<&str>, config: Option<&str>) -> Result<(), RegistryError> {
    if let Some(c) = config {
        let cfg = AllocatorConfig::parse(c).map_err(|e| RegistryError::BadSetting(e.to_string()))?;
        refuse_sharded(&cfg)?;
    }
    if let Some(p) = policy {
        check_policy(p)?;
    }
    if policy.is_none() && config.is_none() {
        return Ok(());
    }
    let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((d, _)) = existing().next() {
        return Err(RegistryError::InUse(format!(
            "cudamem is already in use (device {d} has an allocator): the policy and configuration \
             must be set before the first allocation"
        )));
    }
    let mut o = OVERRIDES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = policy {
        o.policy = Some(p.to_string());
    }
    if let Some(c) = config {
        o.config = Some(c.to_string());
    }
    Ok(())
}

/// Applies `settings` (a `PYTORCH_CUDA_ALLOC_CONF`-style string) at run time to every
/// allocator, existing and to come (torch's `_set_allocator_settings`). Validated first: a bad
/// string changes nothing.
pub fn set_settings_everywhere(settings: &str) -> Result<(), RegistryError> {
    let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    let mut check = effective_settings()?.0;
    check
        .apply(settings)
        .map_err(|e| RegistryError::BadSetting(e.to_string()))?;
    refuse_sharded(&check)?;
    for (_, a) in existing() {
        a.set_settings(settings)?;
    }
    OVERRIDES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .runtime
        .push(settings.to_string());
    Ok(())
}

fn check_policy(name: &str) -> Result<(), RegistryError> {
    let mut scratch = AllocatorConfig::default();
    cudamem_alloc::policy::by_name(name, &mut scratch)
        .map(|_| ())
        .map_err(|e| RegistryError::BadSetting(format!("cudamem: {e}")))
}

/// The configuration and policy name a new allocator gets now.
pub fn effective_settings() -> Result<(AllocatorConfig, String), RegistryError> {
    let o = OVERRIDES.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let config = match &o.config {
        Some(c) => AllocatorConfig::parse(c),
        None => AllocatorConfig::from_env(),
    }
    .map_err(|e| RegistryError::BadSetting(e.to_string()))?;
    let mut config = config;
    for r in &o.runtime {
        config.apply(r).map_err(|e| RegistryError::BadSetting(e.to_string()))?;
    }
    refuse_sharded(&config).map_err(|e| match (e, &o.config) {
        (RegistryError::BadSetting(m), None) => RegistryError::BadSetting(format!("{}: {m}", config_var())),
        (other, _) => other,
    })?;
    let (policy, from_env) = match o.policy {
        Some(p) => (p, false),
        None => match std::env::var("CUDAMEM_POLICY") {
            Ok(p) if !p.trim().is_empty() => (p.trim().to_string(), true),
            _ => (DEFAULT_POLICY.to_string(), false),
        },
    };
    check_policy(&policy).map_err(|e| match e {
        RegistryError::BadSetting(m) if from_env => RegistryError::BadSetting(format!("CUDAMEM_POLICY: {m}")),
        other => other,
    })?;
    Ok((config, policy))
}

/// The environment variable the configuration comes from: the first of
/// [`cudamem_alloc::config::ENV_VARS`] that is set.
fn config_var() -> &'static str {
    cudamem_alloc::config::ENV_VARS
        .into_iter()
        .find(|v| std::env::var_os(v).is_some())
        .unwrap_or(cudamem_alloc::config::ENV_VARS[0])
}

/// `sharded:True` is the Rust API's: this package keeps one allocator lock per device (its
/// history, snapshots and memory fraction need the device-wide view). Said, not ignored.
fn refuse_sharded(cfg: &AllocatorConfig) -> Result<(), RegistryError> {
    if cfg.sharded {
        return Err(RegistryError::BadSetting(
            "sharded:True is not available in the Python package, which keeps one allocator lock per \
             device (per-stream shards are in the Rust API: cudamem::Allocator)"
                .into(),
        ));
    }
    Ok(())
}

/// What kind of device `CUDAMEM_DEVICE` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A real GPU through the CUDA driver.
    Cuda,
    /// A simulated GPU of this many bytes.
    Sim(u64),
}

/// Reads `CUDAMEM_DEVICE`: unset, empty or `cuda` is CUDA; `sim` or `sim:<size>` simulated; `auto`
/// either, as a CUDA device is present or not.
pub fn device_kind() -> Result<DeviceKind, RegistryError> {
    let v = std::env::var("CUDAMEM_DEVICE").unwrap_or_default();
    parse_device_kind(&v)
}

/// See [`device_kind`]. The grammar is the Rust API's device strings ([`cudamem::DeviceSpec`])
/// without an ordinal, which torch chooses: `auto` is `cuda` when a CUDA device is present, else
/// `sim`.
pub fn parse_device_kind(v: &str) -> Result<DeviceKind, RegistryError> {
    let v = v.trim();
    let bad = |why: &str| {
        RegistryError::BadSetting(format!(
            "CUDAMEM_DEVICE={v:?}: {why} (expected 'cuda', 'sim', 'sim:<size>' such as 'sim:8GiB', or 'auto')"
        ))
    };
    if v.is_empty() {
        return Ok(DeviceKind::Cuda);
    }
    match cudamem::DeviceSpec::parse(v) {
        Ok(DeviceSpec::Sim { capacity }) => Ok(DeviceKind::Sim(capacity.unwrap_or(H200_CAPACITY))),
        Ok(DeviceSpec::Cuda(_)) if v.contains(':') => Err(bad(
            "an ordinal is torch's to choose (the current device); name the kind only",
        )),
        Ok(DeviceSpec::Cuda(_)) => Ok(DeviceKind::Cuda),
        Ok(DeviceSpec::Auto) if cudamem_cuda::is_available() => Ok(DeviceKind::Cuda),
        Ok(DeviceSpec::Auto) => Ok(DeviceKind::Sim(H200_CAPACITY)),
        Err(cudamem::Error::BadDevice { reason, .. }) => Err(bad(&reason)),
        Err(e) => Err(bad(&e.to_string())),
    }
}

/// The device of torch's ordinal `ordinal`, of the kind `CUDAMEM_DEVICE` names (a simulated
/// one carries the ordinal as its index, so that snapshots and messages name it).
fn open_device(ordinal: i32) -> Result<OpenedDevice, RegistryError> {
    match device_kind()? {
        DeviceKind::Sim(capacity) => Ok(OpenedDevice::Sim(Arc::new(SimDevice::new(SimConfig {
            index: ordinal,
            capacity,
            ..SimConfig::default()
        })))),
        DeviceKind::Cuda => match cudamem_cuda::CudaDevice::new(ordinal) {
            Ok(d) => Ok(OpenedDevice::Cuda(Arc::new(d))),
            Err(e) => {
                let count = cudamem_cuda::device_count();
                if cudamem_cuda::is_available() && ordinal >= count {
                    Err(RegistryError::BadDevice(format!(
                        "invalid device {ordinal}: this machine has {count} CUDA device(s) ({e})"
                    )))
                } else {
                    Err(RegistryError::Device(e))
                }
            }
        },
    }
}
