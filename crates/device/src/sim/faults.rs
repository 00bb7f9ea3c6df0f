//! Fault injection: a [`FaultPlan`] makes chosen (the `n`th call) or random (a seeded fraction)
//! `malloc`, `map`, event-query and copy calls of a [`SimDevice`] fail.
//!
//! Guarantees: a failing run can be repeated, since the random choice is a deterministic
//! xorshift of the plan's seed; calls are counted per operation from the last
//! [`SimDevice::set_faults`], and not at all while no plan is installed; an injected failure
//! changes nothing on the device.

use std::collections::HashMap;

use super::{SimDevice, SimState};

/// Device calls that a [`FaultPlan`] can make fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `malloc` (cudaMalloc).
    Malloc,
    /// `map` (cuMemCreate/cuMemMap).
    Map,
    /// `query_event` (cuEventQuery); the failure is reported as a driver error.
    QueryEvent,
    /// `copy_to_host` and `copy_from_host` (cuMemcpyDtoH/HtoD), counted together.
    Copy,
}

/// Which device calls fail on purpose.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    /// Fail the calls with these 1-based ordinals, per operation (e.g. the 3rd malloc).
    pub nth: HashMap<FaultOpKey, Vec<u64>>,
    /// Fail this fraction of calls of each listed operation at random.
    pub fraction: f64,
    /// The operations `fraction` applies to.
    pub random_ops: Vec<FaultOp>,
    /// Seed of the random choice, so a failing run can be repeated.
    pub seed: u64,
}

/// Key of [`FaultPlan::nth`] (a `FaultOp`).
pub type FaultOpKey = FaultOp;

impl FaultPlan {
    /// Fails the `n`th (1-based) call of `op`.
    pub fn fail_nth(mut self, op: FaultOp, n: u64) -> Self {
        self.nth.entry(op).or_default().push(n);
        self
    }
    /// Fails a random `fraction` of the calls of `ops`, seeded.
    pub fn fail_fraction(mut self, ops: &[FaultOp], fraction: f64, seed: u64) -> Self {
        self.fraction = fraction;
        self.random_ops = ops.to_vec();
        self.seed = seed.max(1);
        self
    }
}

impl SimDevice {
    /// Installs a fault plan (replacing any earlier one) and resets the call ordinals.
    pub fn set_faults(&self, plan: FaultPlan) {
        let mut s = self.lock();
        s.rng = plan.seed.max(1);
        s.faults = plan;
        s.op_calls.clear();
    }

    pub(super) fn inject(s: &mut SimState, op: FaultOp) -> bool {
        if s.faults.nth.is_empty() && s.faults.fraction <= 0.0 {
            return false; // no plan: nothing to count (set_faults resets the ordinals anyway)
        }
        let n = {
            let c = s.op_calls.entry(op).or_insert(0);
            *c += 1;
            *c
        };
        if s.faults.nth.get(&op).is_some_and(|v| v.contains(&n)) {
            return true;
        }
        if s.faults.fraction > 0.0 && s.faults.random_ops.contains(&op) {
            // xorshift64*: deterministic for a seed, no dependency.
            s.rng ^= s.rng << 13;
            s.rng ^= s.rng >> 7;
            s.rng ^= s.rng << 17;
            let x = (s.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
            return x < s.faults.fraction;
        }
        false
    }
}
