use cudamem::{Allocator, Stream};
fn main() {
    let a = Allocator::with_config("sim", "", "cudamem").unwrap();
    for size in [512usize, 64 << 10, 1 << 20, 16 << 20] {
        for _ in 0..100_000 {
            let b = a.alloc(size, Stream::DEFAULT).unwrap();
            std::hint::black_box(b.device_ptr());
            drop(b);
        }
    }
}
