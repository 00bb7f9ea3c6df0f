//! # The engine lock: one compare-and-swap to take, one plain store to give back
//!
//! [`CachingAllocator`](crate::CachingAllocator) takes its engine's lock twice per cache-hit
//! alloc+free pair. `std::sync::Mutex` gives it back with an atomic swap (the unlocking thread
//! must learn whether a waiter sleeps, to wake it), and keeps poison bookkeeping on both sides.
//! The uncontended take and give-back are a fixed cost of every cache hit, so this lock keeps
//! them to one compare-and-swap and one plain store. A change to it is judged by the cache-hit
//! pair (`gpu_bench` through the Rust API, the API column of the `lock_cost` example) and by
//! several threads on one engine (`gpu_bench`'s one-lock table), the two builds alternated on
//! one machine (`docs/bench/README.md`): it must not be slower at either.
//!
//! This lock is given back with a release store (`mov` on x86: no locked instruction, no
//! pipeline drain). That is possible because **no thread ever sleeps waiting to be woken**: a
//! thread that finds the lock taken spins briefly, then yields its core, then sleeps for short,
//! growing pauses (at most [`MAX_PAUSE`]), looking again after each. So an unlock has nobody to
//! wake and no wake-up can be lost.
//!
//! Guarantees: mutual exclusion (the take is an `Acquire` compare-and-swap, the give-back a
//! `Release` store, so everything done under the lock happens-before the next holder's
//! accesses). Not fair, like `std::sync::Mutex`. No poisoning: a panic under the lock releases
//! it (the guard's `Drop` runs during unwinding) and the next caller is served, as
//! `CachingAllocator` did with `std::sync::Mutex` by ignoring poison. The cost of the polling
//! design falls on contention only: a waiter notices a release up to one pause late, which the
//! one-lock throughput table of `gpu_bench` (several threads on one engine) measures.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Spins (a `pause` each) before a waiter starts yielding its core.
const SPINS: u32 = 100;
/// Yields before a waiter starts sleeping (a holder in a device call may keep the lock for
/// tens of microseconds; a synchronising `empty_cache`, for milliseconds).
const YIELDS: u32 = 200;
/// The longest sleep between two looks at the lock.
pub const MAX_PAUSE: Duration = Duration::from_micros(200);

/// A value behind the lock. See the module documentation (`lock.rs`).
pub struct EngineLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time (mutual exclusion by the
// compare-and-swap in `lock`, published by the release store in the guard's drop), exactly the
// contract of `std::sync::Mutex<T>`, which is `Sync` and `Send` for `T: Send`.
unsafe impl<T: Send> Sync for EngineLock<T> {}
// SAFETY: as above; moving the lock moves the value.
unsafe impl<T: Send> Send for EngineLock<T> {}

impl<T> EngineLock<T> {
    /// A lock holding `value`, not taken.
    pub fn new(value: T) -> Self {
        EngineLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting as long as it takes.
    #[inline]
    pub fn lock(&self) -> EngineGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        EngineGuard { lock: self }
    }

    /// Takes the lock if nobody holds it.
    pub fn try_lock(&self) -> Option<EngineGuard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(EngineGuard { lock: self })
    }

    /// Waits for the lock: look without writing (no cache-line traffic while it is held), try
    /// when it looks free; spin, then yield, then sleep between looks.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut waited = 0u32;
        let mut pause = Duration::from_micros(1);
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if waited < SPINS {
                    std::hint::spin_loop();
                } else if waited < SPINS + YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                waited = waited.saturating_add(1);
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<T> std::fmt::Debug for EngineLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLock")
            .field("locked", &self.locked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Access to the value while the lock is held; dropping it gives the lock back.
pub struct EngineGuard<'a, T> {
    lock: &'a EngineLock<T>,
}

impl<T> Deref for EngineGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for EngineGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only access through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for EngineGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for EngineGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Threads incrementing a plain (non-atomic) counter under the lock lose no increment:
    /// mutual exclusion, and each holder sees the previous holder's writes.
    #[test]
    fn excludes_and_publishes() {
        const THREADS: usize = 8;
        const EACH: usize = 20_000;
        let lock = Arc::new(EngineLock::new((0u64, Vec::<usize>::new())));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let mut g = lock.lock();
                        // A read-modify-write that two holders at once would break.
                        let v = g.0;
                        std::hint::black_box(&v);
                        g.0 = v + 1;
                        if i % 1000 == 0 {
                            g.1.push(t);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let g = lock.lock();
        assert_eq!(g.0, (THREADS * EACH) as u64);
        assert_eq!(g.1.len(), THREADS * EACH / 1000);
    }

    /// A waiter gets the lock after a long hold (it sleeps, and nothing has to wake it).
    #[test]
    fn waiter_gets_the_lock_after_a_long_hold() {
        let lock = Arc::new(EngineLock::new(0u32));
        let g = lock.lock();
        let l2 = Arc::clone(&lock);
        let waiter = std::thread::spawn(move || {
            *l2.lock() += 1;
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(lock.try_lock().is_none(), "held");
        drop(g);
        waiter.join().unwrap();
        assert_eq!(*lock.lock(), 1);
    }

    /// A panic under the lock gives it back.
    #[test]
    fn a_panic_releases_the_lock() {
        let lock = Arc::new(EngineLock::new(5u32));
        let l2 = Arc::clone(&lock);
        let r = std::thread::spawn(move || {
            let _g = l2.lock();
            panic!("under the lock");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.try_lock().expect("released by the unwinding"), 5);
    }
}
