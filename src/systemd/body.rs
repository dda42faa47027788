//! Reading a D-Bus message body in its wire format, as far as the agent reads one: its basic
//! values, and any value skipped by its signature without being looked at.
//!
//! Every unit signal systemd sends carries every property of its interface (22 of `Unit`, more
//! of `Service`, 800 to 1,000 bytes), of which the agent uses a handful. Walking those bodies
//! with zbus's deserializer cost 5 us warm and up to 30 us cold a signal, twice per death, on
//! the way to every proof; this reader skips an array by its length and a value by its
//! signature. Pure, bounds-checked at every step: malformed bytes are a [`BodyError`], never a
//! panic. Only `signal.rs` uses it, for PropertiesChanged.

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {at} of the body")]
pub(crate) struct BodyError {
    what: &'static str,
    at: usize,
}

/// How many containers (variants, structs, dict entries, arrays) a skipped value may nest: the
/// D-Bus specification's limit for a message.
const MAX_DEPTH: usize = 64;

/// A cursor over a body's bytes.
pub(crate) struct BodyReader<'a> {
    bytes: &'a [u8],
    /// Where `bytes` begins in the whole message: alignment is counted from the message's start.
    base: usize,
    pos: usize,
    big_endian: bool,
}

impl<'a> BodyReader<'a> {
    /// A reader at the start of `bytes`, which begin at byte `base` of their message.
    pub(crate) fn new(bytes: &'a [u8], base: usize, big_endian: bool) -> Self {
        Self {
            bytes,
            base,
            pos: 0,
            big_endian,
        }
    }

    fn error(&self, what: &'static str) -> BodyError {
        BodyError { what, at: self.pos }
    }

    /// Skips the padding up to the next multiple of `alignment`; padding bytes must be zero.
    pub(crate) fn align(&mut self, alignment: usize) -> Result<(), BodyError> {
        let misalignment = (self.base + self.pos) % alignment;
        if misalignment == 0 {
            return Ok(());
        }
        let padding = self.take(alignment - misalignment)?;
        if padding.iter().any(|b| *b != 0) {
            return Err(self.error("non-zero padding"));
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], BodyError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error("body ends early"))?;
        let taken = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], BodyError> {
        self.align(N)?;
        let mut bytes: [u8; N] = self.take(N)?.try_into().expect("take gives N bytes");
        if self.big_endian != cfg!(target_endian = "big") {
            bytes.reverse();
        }
        Ok(bytes)
    }

    /// A `u` (UINT32).
    pub(crate) fn u32(&mut self) -> Result<u32, BodyError> {
        self.fixed().map(u32::from_ne_bytes)
    }

    /// An `i` (INT32).
    pub(crate) fn i32(&mut self) -> Result<i32, BodyError> {
        self.fixed().map(i32::from_ne_bytes)
    }

    /// A `t` (UINT64).
    pub(crate) fn u64(&mut self) -> Result<u64, BodyError> {
        self.fixed().map(u64::from_ne_bytes)
    }

    /// The bytes of an `s` or `o`, without its terminating zero (not yet checked to be UTF-8).
    pub(crate) fn string_bytes(&mut self) -> Result<&'a [u8], BodyError> {
        let len = self.u32()?;
        self.terminated(len as usize)
    }

    /// An `s` (or `o`): UTF-8.
    pub(crate) fn string(&mut self) -> Result<&'a str, BodyError> {
        let bytes = self.string_bytes()?;
        std::str::from_utf8(bytes).map_err(|_| self.error("a string that is not UTF-8"))
    }

    /// A `g`: the signature, without its terminating zero.
    pub(crate) fn signature(&mut self) -> Result<&'a [u8], BodyError> {
        let len = self.take(1)?[0];
        self.terminated(usize::from(len))
    }

    /// `len` bytes followed by a zero byte, which must be the only one.
    fn terminated(&mut self, len: usize) -> Result<&'a [u8], BodyError> {
        let bytes = self.take(len)?;
        if self.take(1)? != [0] || bytes.contains(&0) {
            return Err(self.error("a string not ended by its one zero byte"));
        }
        Ok(bytes)
    }

    /// Begins an array whose elements align to `alignment`: where its elements end.
    pub(crate) fn array(&mut self, alignment: usize) -> Result<usize, BodyError> {
        let len = self.u32()? as usize;
        self.align(alignment)?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error("an array longer than the body"))?;
        Ok(end)
    }

    /// Whether the array ending at `end` has another element; past its end is an error.
    pub(crate) fn has_next(&self, end: usize) -> Result<bool, BodyError> {
        match self.pos.cmp(&end) {
            std::cmp::Ordering::Less => Ok(true),
            std::cmp::Ordering::Equal => Ok(false),
            std::cmp::Ordering::Greater => Err(self.error("an element overruns its array")),
        }
    }

    /// An `ay` (array of bytes).
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], BodyError> {
        let end = self.array(1)?;
        self.take(end - self.pos)
    }

    /// Skips a value of the single complete type `signature`.
    pub(crate) fn skip(&mut self, signature: &[u8]) -> Result<(), BodyError> {
        match self.skip_one(signature, 0)? {
            [] => Ok(()),
            _ => Err(self.error("a signature of more than one complete type")),
        }
    }

    /// Skips a value of the first complete type of `signature`, and gives the rest of it.
    fn skip_one<'s>(&mut self, signature: &'s [u8], depth: usize) -> Result<&'s [u8], BodyError> {
        if depth > MAX_DEPTH {
            return Err(self.error("values nested too deep"));
        }
        let (&code, rest) = signature
            .split_first()
            .ok_or_else(|| self.error("a signature that ends early"))?;
        match code {
            b'y' => drop(self.take(1)?),
            b'n' | b'q' => drop(self.fixed::<2>()?),
            b'b' | b'i' | b'u' | b'h' => drop(self.fixed::<4>()?),
            b'x' | b't' | b'd' => drop(self.fixed::<8>()?),
            b's' | b'o' => drop(self.string_bytes()?),
            b'g' => drop(self.signature()?),
            b'v' => {
                let inner = self.signature()?;
                if !self.skip_one(inner, depth + 1)?.is_empty() {
                    return Err(self.error("a variant of more than one complete type"));
                }
            }
            b'a' => {
                let (element, after) = split_complete_type(rest, depth + 1)
                    .ok_or_else(|| self.error("an invalid array signature"))?;
                let end = self.array(alignment(element[0]))?;
                // The elements are not looked at: the array is skipped by its length.
                self.pos = end;
                return Ok(after);
            }
            b'(' | b'{' => {
                let close = if code == b'(' { b')' } else { b'}' };
                self.align(8)?;
                let mut fields = rest;
                loop {
                    match fields.first() {
                        Some(&c) if c == close => return Ok(&fields[1..]),
                        Some(_) => fields = self.skip_one(fields, depth + 1)?,
                        None => return Err(self.error("a container signature never closed")),
                    }
                }
            }
            _ => return Err(self.error("an unknown type in a signature")),
        }
        Ok(rest)
    }
}

/// The alignment of a value whose type begins with `code`.
fn alignment(code: u8) -> usize {
    match code {
        b'n' | b'q' => 2,
        b'b' | b'i' | b'u' | b'h' | b's' | b'o' | b'a' => 4,
        b'x' | b't' | b'd' | b'(' | b'{' => 8,
        // y, g, v, and anything unknown (which skipping an element would reject).
        _ => 1,
    }
}

/// `signature` split after its first complete type; `None` if it holds none.
fn split_complete_type(signature: &[u8], depth: usize) -> Option<(&[u8], &[u8])> {
    if depth > MAX_DEPTH {
        return None;
    }
    let (&code, mut rest) = signature.split_first()?;
    match code {
        b'y' | b'n' | b'q' | b'b' | b'i' | b'u' | b'h' | b'x' | b't' | b'd' | b's' | b'o'
        | b'g' | b'v' => {}
        b'a' => rest = split_complete_type(rest, depth + 1)?.1,
        b'(' | b'{' => {
            let close = if code == b'(' { b')' } else { b'}' };
            loop {
                match rest.first() {
                    Some(&c) if c == close => {
                        rest = &rest[1..];
                        break;
                    }
                    Some(_) => rest = split_complete_type(rest, depth + 1)?.1,
                    None => return None,
                }
            }
        }
        _ => return None,
    }
    Some(signature.split_at(signature.len() - rest.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use zbus::wire::serialized::Context;
    use zbus::wire::{Endian, Structure, Variant};

    /// `value` as zbus lays it out at byte `base` of a message, in `endian`.
    fn marshalled<T: serde::Serialize + zbus::wire::DynamicType>(
        value: &T,
        base: usize,
        endian: Endian,
    ) -> Vec<u8> {
        zbus::wire::to_bytes(Context::new(endian, base), value)
            .expect("a value that serializes")
            .to_vec()
    }

    #[test]
    fn basic_values_read_back_in_either_byte_order_and_at_any_offset() {
        for endian in [Endian::Little, Endian::Big] {
            for base in [0, 1, 3, 8] {
                let bytes = marshalled(
                    &(7u8, 0xdead_beefu32, -5i32, 1u64 << 40, "héllo"),
                    base,
                    endian,
                );
                let mut r = BodyReader::new(&bytes, base, endian == Endian::Big);
                // zbus lays a tuple out as a struct, which begins at a multiple of 8.
                r.align(8).unwrap();
                r.skip(b"y").unwrap();
                assert_eq!(r.u32().unwrap(), 0xdead_beef, "{endian:?} at {base}");
                assert_eq!(r.i32().unwrap(), -5);
                assert_eq!(r.u64().unwrap(), 1 << 40);
                assert_eq!(r.string().unwrap(), "héllo");
                assert!(!r.has_next(bytes.len()).unwrap());
            }
        }
    }

    #[test]
    fn any_value_is_skipped_whole_by_its_signature() {
        let nested = Variant::Variant(Box::new(Variant::from(Structure::from((
            1u8,
            "x",
            vec![2u64, 3],
        )))));
        let dict = HashMap::from([("a", Variant::from(1u16)), ("b", Variant::from(true))]);
        let value = (
            1u8,
            (2i16, 3u16, true, 4u32),
            (5i64, 6u64, 7.5f64),
            vec![vec![(1u8, "s")], vec![]],
            dict,
            nested,
            zbus::wire::Signature::try_from("a{sv}").unwrap(),
            zbus::ObjectPath::try_from("/o/p").unwrap(),
        );
        let signature = b"(y(nqbu)(xtd)aa(ys)a{sv}vgo)";
        for endian in [Endian::Little, Endian::Big] {
            for base in [0, 4] {
                let mut bytes = marshalled(&value, base, endian);
                let end = bytes.len();
                bytes.extend(marshalled(&0xabcdu32, base + end, endian));
                let mut r = BodyReader::new(&bytes, base, endian == Endian::Big);
                r.skip(signature).unwrap();
                assert_eq!(r.pos, end, "{endian:?} at {base}");
                assert_eq!(r.u32().unwrap(), 0xabcd);
            }
        }
    }

    #[test]
    fn every_truncation_of_a_body_is_an_error_not_a_panic() {
        let bytes = marshalled(
            &(
                "iface",
                HashMap::from([("k", Variant::from(vec![1u8, 2]))]),
                vec!["n"],
            ),
            0,
            Endian::Little,
        );
        for len in 0..bytes.len() {
            let mut r = BodyReader::new(&bytes[..len], 0, false);
            assert!(r.skip(b"(sa{sv}as)").is_err(), "cut at {len}");
        }
        let mut r = BodyReader::new(&bytes, 0, false);
        r.skip(b"(sa{sv}as)").unwrap();
    }

    #[test]
    fn malformed_signatures_and_strings_are_errors() {
        let bytes = marshalled(&(1u32, 2u32), 0, Endian::Little);
        for signature in [&b""[..], b"uu", b"(u", b"a", b"{u", b"z", b"a(u"] {
            let mut r = BodyReader::new(&bytes, 0, false);
            assert!(
                r.skip(signature).is_err(),
                "{:?}",
                String::from_utf8_lossy(signature)
            );
        }
        // A string whose terminating byte is not zero.
        let mut bytes = marshalled(&"ab", 0, Endian::Little);
        *bytes.last_mut().unwrap() = b'c';
        assert!(BodyReader::new(&bytes, 0, false).string().is_err());
        // Invalid UTF-8.
        let mut bytes = marshalled(&"ab", 0, Endian::Little);
        bytes[4] = 0xff;
        assert!(BodyReader::new(&bytes, 0, false).string().is_err());
        // An array that claims more bytes than there are.
        let bytes = marshalled(&vec![1u32, 2], 0, Endian::Little);
        let mut long = bytes.clone();
        long[0] = 200;
        assert!(BodyReader::new(&long, 0, false).skip(b"au").is_err());
        assert!(BodyReader::new(&bytes, 0, false).skip(b"au").is_ok());
    }

    #[test]
    fn deeply_nested_variants_are_refused_without_exhausting_the_stack() {
        // 200 variants, each holding the next: v, then its signature "v", ...
        let mut bytes = Vec::new();
        for _ in 0..200 {
            bytes.extend_from_slice(&[1, b'v', 0]);
        }
        bytes.extend_from_slice(&[1, b'y', 0, 7]);
        let mut r = BodyReader::new(&bytes, 0, false);
        assert_eq!(r.skip(b"v").unwrap_err().what, "values nested too deep");
        let deep_array = [b'a'; 500];
        let mut r = BodyReader::new(&[0; 8], 0, false);
        assert!(r.skip(&deep_array).is_err());
    }

    proptest::proptest! {
        /// Arbitrary bytes under arbitrary signatures: an answer or an error, never a panic,
        /// and never a position past the end.
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            signature in "[ynqbiuhxtdsogva(){}]{0,12}",
            base in 0usize..8,
            big_endian in proptest::bool::ANY,
        ) {
            let mut r = BodyReader::new(&bytes, base, big_endian);
            let _ = r.skip(signature.as_bytes());
            proptest::prop_assert!(r.pos <= bytes.len());
        }
    }
}
