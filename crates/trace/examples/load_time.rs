//! Prints how long reading a trace file takes: `load_time FILE...`.
fn main() {
    for p in std::env::args().skip(1) {
        let t = std::time::Instant::now();
        match cudamem_trace::read_path(std::path::Path::new(&p)) {
            Ok(tr) => println!("{p}: {} events in {:.3} s", tr.num_events(), t.elapsed().as_secs_f64()),
            Err(e) => println!("{p}: {e}"),
        }
    }
}
