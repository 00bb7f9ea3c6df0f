//! Prints the run an `allocator_ops` input decodes to (policy, settings, capacity, faults and
//! the calls), for turning a crash into a unit test.
//!
//! Usage (from `fuzz/`): `cargo run --release --example decode_ops -- <file>`

fn main() {
    let file = std::env::args().nth(1).expect("usage: decode_ops <file>");
    let data = std::fs::read(file).unwrap();
    let r = cudamem_fuzz::decode(&data, 400);
    println!("policy {:?}, settings {:?}, capacity {}", r.policy, r.settings, r.capacity);
    println!("faults {:?}", r.faults);
    for (i, op) in r.ops.iter().enumerate() {
        println!("{i:4} {op:?}");
    }
}
