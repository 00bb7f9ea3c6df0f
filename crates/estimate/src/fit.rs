//! Fitting one allocation's size as a function of the batch size.
//!
//! Sizes are fitted by least squares with a polynomial of degree 1 (`a + b·B`: activations,
//! inputs and their gradients grow with the batch, weights do not) or 2 (`a + b·L + c·L²`, for
//! sequence lengths, where attention scores grow with the square). The batch is divided by the
//! largest recorded one before fitting so that the normal equations stay well conditioned. A size
//! equal in every trace is constant, exactly. Predictions are rounded to whole bytes and never go
//! below one byte (an allocation does not vanish because the line through it crosses zero).

/// The fitted size of one allocation.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeFit {
    /// Coefficients of the polynomial in `B / scale`, lowest power first.
    coef: Vec<f64>,
    /// The batch the polynomial's variable is divided by.
    scale: f64,
    /// The largest |recorded − fitted| size over the traces, in bytes.
    pub max_residual: f64,
    /// Whether the size is the same in every trace.
    pub constant: bool,
}

impl SizeFit {
    /// The fitted size at `batch`, in whole bytes, at least 1.
    pub fn at(&self, batch: u64) -> u64 {
        let x = batch as f64 / self.scale;
        let mut v = 0.0;
        for c in self.coef.iter().rev() {
            v = v * x + c;
        }
        if v.is_finite() {
            v.round().clamp(1.0, u64::MAX as f64) as u64
        } else {
            1
        }
    }
    /// Bytes per unit of batch at `batch` (the derivative), for reports.
    pub fn slope(&self, batch: u64) -> f64 {
        let x = batch as f64 / self.scale;
        let mut d = 0.0;
        for (p, c) in self.coef.iter().enumerate().skip(1) {
            d += p as f64 * c * x.powi(p as i32 - 1);
        }
        d / self.scale
    }
}

/// Fits `sizes[i]` recorded at `batches[i]` with a polynomial of `degree` (1 or 2).
pub fn fit_sizes(batches: &[u64], sizes: &[u64], degree: usize) -> Result<SizeFit, String> {
    if batches.len() != sizes.len() || batches.is_empty() {
        return Err("one size per batch is needed".into());
    }
    if !(1..=2).contains(&degree) {
        return Err(format!(
            "degree {degree}: sizes are fitted with degree 1 (linear) or 2 (quadratic)"
        ));
    }
    if batches.len() <= degree {
        return Err(format!(
            "a degree-{degree} fit needs traces at {} or more sizes, not {}",
            degree + 1,
            batches.len()
        ));
    }
    let scale = batches.iter().copied().max().unwrap_or(1).max(1) as f64;
    if sizes.iter().all(|&s| s == sizes[0]) {
        return Ok(SizeFit {
            coef: vec![sizes[0] as f64],
            scale,
            max_residual: 0.0,
            constant: true,
        });
    }
    let n = degree + 1;
    // Normal equations A^T A c = A^T y, with A[i][p] = x_i^p.
    let mut m = vec![vec![0.0f64; n + 1]; n];
    for (&b, &s) in batches.iter().zip(sizes) {
        let x = b as f64 / scale;
        let pw: Vec<f64> = (0..n).map(|p| x.powi(p as i32)).collect();
        for r in 0..n {
            for c in 0..n {
                m[r][c] += pw[r] * pw[c];
            }
            m[r][n] += pw[r] * s as f64;
        }
    }
    let coef = solve(m).ok_or_else(|| format!("batch sizes {batches:?} do not determine a degree-{degree} fit"))?;
    let mut f = SizeFit {
        coef,
        scale,
        max_residual: 0.0,
        constant: false,
    };
    f.max_residual = batches
        .iter()
        .zip(sizes)
        .map(|(&b, &s)| (f.value(b) - s as f64).abs())
        .fold(0.0, f64::max);
    Ok(f)
}

impl SizeFit {
    fn value(&self, batch: u64) -> f64 {
        let x = batch as f64 / self.scale;
        self.coef.iter().rev().fold(0.0, |v, c| v * x + c)
    }
}

/// Gaussian elimination with partial pivoting on an augmented n×(n+1) matrix.
fn solve(mut m: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = m.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[piv][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, piv);
        let pivot = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot[col];
                for (x, p) in row.iter_mut().zip(&pivot).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_sizes_extrapolate_exactly() {
        let f = fit_sizes(&[8, 16, 32], &[1000 + 8 * 4096, 1000 + 16 * 4096, 1000 + 32 * 4096], 1).unwrap();
        assert_eq!(f.at(64), 1000 + 64 * 4096);
        assert!(f.max_residual < 1e-3);
        assert!(!f.constant);
        assert!((f.slope(64) - 4096.0).abs() < 1e-6);
    }

    #[test]
    fn constants_stay_constant_and_sizes_stay_positive() {
        let f = fit_sizes(&[2, 4], &[777, 777], 1).unwrap();
        assert!(f.constant);
        assert_eq!(f.at(1000), 777);
        let down = fit_sizes(&[2, 4], &[400, 200], 1).unwrap();
        assert_eq!(down.at(100), 1);
    }

    #[test]
    fn quadratic_sizes_and_bad_inputs() {
        let sq = |l: u64| 12 * l * l + 64 * l + 100;
        let f = fit_sizes(&[128, 256, 512], &[sq(128), sq(256), sq(512)], 2).unwrap();
        assert_eq!(f.at(2048), sq(2048));
        assert!(fit_sizes(&[1, 2], &[1, 2], 2).unwrap_err().contains("3 or more"));
        assert!(fit_sizes(&[1, 2], &[1, 2], 3).is_err());
        assert!(fit_sizes(&[1], &[1, 2], 1).is_err());
    }
}
