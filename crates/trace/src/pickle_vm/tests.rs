use super::*;

#[test]
fn decodes_a_small_protocol_4_pickle() {
    // pickle.dumps({'a': [1, 2], 'b': (None, True)}, protocol=4)
    let p =
        b"\x80\x04\x95\x17\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94N\x88\x86\x94u.";
    let (a, root) = decode(p).unwrap();
    let d = a.obj(&root).unwrap();
    assert_eq!(d.kind, Kind::Dict);
    assert_eq!(d.items.len(), 4);
    assert_eq!(a.str(&d.items[0]), Some("a"));
    assert_eq!(a.obj(&d.items[1]).unwrap().items, vec![Val::Int(1), Val::Int(2)]);
    assert_eq!(a.obj(&d.items[3]).unwrap().items, vec![Val::None, Val::Bool(true)]);
}

#[test]
fn ints() {
    assert_eq!(int_from_le(&[]), Num::Small(0));
    assert_eq!(int_from_le(&[0xff]), Num::Small(-1));
    assert_eq!(int_from_le(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), Num::Wide(1i128 << 63));
    assert_eq!(int_from_le(&[0x01; 17]), Num::Huge);
    let mut redundant = vec![5u8];
    redundant.extend([0u8; 30]);
    assert_eq!(int_from_le(&redundant), Num::Small(5));
    assert_eq!(int_from_text("01"), Some(Num::Bool(true)));
    assert_eq!(int_from_text("123L"), Some(Num::Small(123)));
    assert_eq!(
        int_from_text("99999999999999999999999999999999999999999"),
        Some(Num::Huge)
    );
    assert_eq!(int_from_text("x"), None);
    assert_eq!(std::mem::size_of::<Val<'static>>(), 24);
}

#[test]
fn sharing_not_copying() {
    // x = [1]; l0 = [x, x]; l1 = [l0, l0]; … 200 levels: linear work.
    let mut p = vec![0x80, 4, b']', 0x94, b'K', 1, b'a'];
    for i in 0..200u32 {
        p.push(b'(');
        p.push(b'j');
        p.extend_from_slice(&i.to_le_bytes());
        p.push(b'j');
        p.extend_from_slice(&i.to_le_bytes());
        p.push(b'l');
        p.push(0x94);
    }
    p.push(b'.');
    let (a, _) = decode(&p).unwrap();
    assert_eq!(a.objs.len(), 201);
}

#[test]
fn recursive_and_deep_structures_are_fine() {
    // l = []; l.append(l)
    let (a, root) = decode(b"\x80\x04]\x94h\x00a.").unwrap();
    assert_eq!(a.obj(&root).unwrap().items[0], root);
    let mut p = vec![0x80, 4];
    p.resize(p.len() + 1_000_000, b']');
    p.resize(p.len() + 999_999, b'a');
    p.push(b'.');
    assert!(decode(&p).is_ok());
}

#[test]
fn rejects_bad_input() {
    for bad in [
        &b""[..],
        b"\x80\x04",
        b"\x80\x04X\xff\xff\xff\xff",
        b"\x80\x04\x8c\x08builtins\x8c\x03set\x93.",
        b"\x80\x04a.",
        b"\x80\x04K\x01a.",
        b"\x80\x04h\x05.",
        b"\x80\x04N.extra",
        b"\x80\x04(K\x01d.",
        b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffab.",
        b"\x80\x04\x8c\x02\xff\xfe.",
    ] {
        assert!(decode(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn text_opcodes() {
    // Protocol 0: pickle.dumps({'k': 'v\u20ac', 'n': 5, 'f': 1.5}, protocol=0)
    let p = b"(dp0\nVk\np1\nVv\\u20ac\np2\nsVn\np3\nI5\nsVf\np4\nF1.5\ns.";
    let (a, root) = decode(p).unwrap();
    let d = a.obj(&root).unwrap();
    assert_eq!(a.str(&d.items[1]), Some("v\u{20ac}"));
    assert_eq!(d.items[3], Val::Int(5));
    assert_eq!(d.items[5], Val::Float(1.5));
    let (a, root) = decode(b"S'it\\'s'\np0\n.").unwrap();
    assert_eq!(a.str(&root), Some("it's"));
}

/// Structural equality of our decoding and serde-pickle's.
fn same(a: &Arena<'_>, v: &Val<'_>, s: &serde_pickle::Value, depth: u32) -> bool {
    use serde_pickle::{HashableValue as H, Value as S};
    assert!(depth < 32, "unexpectedly deep");
    let key = |k: &Val<'_>| -> Option<H> {
        Some(match *k {
            Val::None => H::None,
            Val::Bool(b) => H::Bool(b),
            Val::Int(n) => H::I64(n),
            Val::Float(x) => H::F64(x),
            _ => H::String(a.str(k)?.to_string()),
        })
    };
    match (v, s) {
        (Val::None, S::None) => true,
        (Val::Bool(x), S::Bool(y)) => x == y,
        (Val::Int(x), S::I64(y)) => x == y,
        (Val::Wide(_), S::Int(b)) => a.int(v).map(|i| i.to_string()) == Some(b.to_string()),
        (Val::Float(x), S::F64(y)) => x.to_bits() == y.to_bits(),
        (Val::Str(_) | Val::Text(_), S::String(y)) => a.str(v) == Some(y.as_str()),
        (Val::Bytes(x), S::Bytes(y)) => x == y,
        (Val::Obj(_), S::List(ys)) | (Val::Obj(_), S::Tuple(ys)) => {
            let o = a.obj(v).unwrap();
            let kind_ok = matches!((o.kind, s), (Kind::List, S::List(_)) | (Kind::Tuple, S::Tuple(_)));
            kind_ok && o.items.len() == ys.len() && o.items.iter().zip(ys).all(|(x, y)| same(a, x, y, depth + 1))
        }
        (Val::Obj(_), S::Dict(m)) => {
            let o = a.obj(v).unwrap();
            o.kind == Kind::Dict
                && o.items.len() == 2 * m.len()
                && o.items.chunks_exact(2).all(|kv| {
                    key(&kv[0])
                        .and_then(|k| m.get(&k))
                        .is_some_and(|y| same(a, &kv[1], y, depth + 1))
                })
        }
        _ => false,
    }
}

#[test]
fn agrees_with_serde_pickle_on_shared_traces() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
    for name in ["seed_example", "resnet50_train", "gpt2_train"] {
        let gz = std::fs::read(dir.join(format!("{name}.pickle.gz"))).unwrap();
        let raw = crate::gunzip(&gz, name).unwrap();
        let (a, root) = decode(&raw).unwrap();
        let reference = serde_pickle::value_from_slice(&raw, serde_pickle::DeOptions::new()).unwrap();
        assert!(same(&a, &root, &reference, 0), "{name}");
        // And on what our writer produces.
        let t = crate::read_pickle(&raw, name).unwrap();
        let mut out = Vec::new();
        crate::write_snapshot_pickle(&t, &mut out).unwrap();
        let (a, root) = decode(&out).unwrap();
        let reference = serde_pickle::value_from_slice(&out, serde_pickle::DeOptions::new()).unwrap();
        assert!(same(&a, &root, &reference, 0), "{name} rewritten");
    }
}
