//! A tar reader that reads layers the way containerd does: by Go's `archive/tar` rules.
//!
//! Why not the `tar` crate: its reader reads GNU long names and PAX records whole, with no
//! bound, and its raw mode drops the PAX `size` override. What differs from Go changes what
//! lands on disk, so this reader follows Go's (`archive/tar/reader.go`, Go 1.2x) on each point
//! a layer can hit: the checksum (signed or unsigned), octal and base-256 numbers, the USTAR
//! prefix, GNU and star access times, PAX records (`path`, `linkpath`, `uid`, `gid`, `mtime`,
//! `atime`, `size`, `SCHILY.xattr.*`; an empty value keeps the header's), GNU long names and
//! links, the legacy type `\0` (a directory when the name ends in `/`), header-only types
//! whose size field is ignored, and the end of the archive (end of input at a header or in
//! the padding, or two zero blocks; a zero block followed by anything else is an error).
//!
//! Bounds: a PAX header or a GNU long name or link is read into memory only up to 1 MiB (Go's
//! `maxSpecialFileSize`; larger is refused before any of it is read), so an entry's name, link
//! target and xattrs together stay under that. Sparse files (GNU type `S`, `GNU.sparse.*`
//! records) are refused: Go would expand them, and layers do not carry them.

use std::collections::BTreeMap;
use std::io::{self, Read};

use super::error::ApplyError;

/// Size of a tar block.
const BLOCK: usize = 512;
/// Largest PAX header or GNU long name/link read into memory (Go's `maxSpecialFileSize`).
pub(super) const MAX_SPECIAL: i64 = 1 << 20;

/// An instant, in nanoseconds since the Unix epoch (Go's `time.Time` range fits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Time(pub i128);

impl Time {
    fn from_secs(secs: i64) -> Self {
        Time(i128::from(secs) * 1_000_000_000)
    }
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `0`, or `\0` without a trailing `/`.
    Regular,
    /// `1`.
    Link,
    /// `2`.
    Symlink,
    /// `3`.
    Char,
    /// `4`.
    Block,
    /// `5`, or `\0` with a trailing `/`.
    Dir,
    /// `6`.
    Fifo,
    /// `g`: a PAX global header, which containerd skips.
    Global,
    /// Anything else (`7`, `V`, ...): containerd refuses it.
    Other(u8),
}

impl Kind {
    fn of(flag: u8, name: &[u8]) -> Self {
        match flag {
            b'0' => Kind::Regular,
            0 if name.ends_with(b"/") => Kind::Dir,
            0 => Kind::Regular,
            b'1' => Kind::Link,
            b'2' => Kind::Symlink,
            b'3' => Kind::Char,
            b'4' => Kind::Block,
            b'5' => Kind::Dir,
            b'6' => Kind::Fifo,
            b'g' => Kind::Global,
            other => Kind::Other(other),
        }
    }
}

/// One entry's header, PAX records and GNU long names merged in.
#[derive(Debug, Clone)]
pub(super) struct Header {
    /// The type.
    pub kind: Kind,
    /// The name as the archive spells it.
    pub name: Vec<u8>,
    /// The link target (hard and symbolic links).
    pub linkname: Vec<u8>,
    /// Mode bits as stored.
    pub mode: i64,
    /// Owner.
    pub uid: i64,
    /// Group.
    pub gid: i64,
    /// Data size (0 for the header-only types whatever the field says).
    pub size: i64,
    /// Modification time.
    pub mtime: Time,
    /// Access time, when the archive has one.
    pub atime: Option<Time>,
    /// Device numbers.
    pub devmajor: i64,
    /// Device numbers.
    pub devminor: i64,
    /// `SCHILY.xattr.<key>` records, by key.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Reads entries; between two calls of [`TarReader::next`] it reads the current entry's data.
pub(super) struct TarReader<R> {
    inner: R,
    /// Data bytes of the current entry not read yet.
    remaining: u64,
    /// Padding after the current entry's data.
    pad: u64,
    /// Bytes of input consumed (for error messages).
    offset: u64,
}

fn header_only(flag: u8) -> bool {
    matches!(flag, b'1' | b'2' | b'3' | b'4' | b'5' | b'6')
}

fn padding(n: u64) -> u64 {
    (BLOCK as u64 - n % BLOCK as u64) % BLOCK as u64
}

impl<R: Read> TarReader<R> {
    /// A reader of the archive `inner` holds.
    pub(super) fn new(inner: R) -> Self {
        Self {
            inner,
            remaining: 0,
            pad: 0,
            offset: 0,
        }
    }

    fn bad(&self, reason: &'static str) -> ApplyError {
        ApplyError::Header {
            offset: self.offset,
            reason,
        }
    }

    /// Reads up to `buf.len()` bytes; fewer only at the end of the input.
    fn read_full(&mut self, buf: &mut [u8]) -> Result<usize, ApplyError> {
        let mut n = 0;
        while n < buf.len() {
            match self.inner.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ApplyError::Read(e)),
            }
        }
        self.offset += n as u64;
        Ok(n)
    }

    /// A whole block, or `None` at the end of the input before its first byte.
    fn read_block(&mut self) -> Result<Option<[u8; BLOCK]>, ApplyError> {
        let mut block = [0u8; BLOCK];
        match self.read_full(&mut block)? {
            0 => Ok(None),
            BLOCK => Ok(Some(block)),
            _ => Err(ApplyError::Read(io::ErrorKind::UnexpectedEof.into())),
        }
    }

    /// Skips the rest of the current entry's data (an error if the input ends first) and its
    /// padding; `false` when the input ends in the padding (Go takes that as the end).
    fn skip_current(&mut self) -> Result<bool, ApplyError> {
        let want = self.remaining;
        let skipped =
            io::copy(&mut self.by_ref().take(want), &mut io::sink()).map_err(ApplyError::Read)?;
        if skipped < want {
            return Err(ApplyError::Read(io::ErrorKind::UnexpectedEof.into()));
        }
        let mut pad = [0u8; BLOCK];
        let want = usize::try_from(self.pad).unwrap_or(BLOCK).min(BLOCK);
        self.pad = 0;
        Ok(self.read_full(&mut pad[..want])? == want)
    }

    /// Reads a PAX header's or GNU long name's data (at most [`MAX_SPECIAL`] bytes).
    fn read_special(&mut self, what: &'static str, size: i64) -> Result<Vec<u8>, ApplyError> {
        if size > MAX_SPECIAL {
            return Err(ApplyError::SpecialTooLarge { what, size });
        }
        // size is within 0..=1 MiB here (negative sizes were refused by the caller).
        let mut data = vec![0u8; usize::try_from(size).unwrap_or(0)];
        let n = self.read(&mut data).and_then(|first| {
            let mut n = first;
            while n < data.len() {
                match self.read(&mut data[n..])? {
                    0 => break,
                    k => n += k,
                }
            }
            Ok(n)
        });
        match n {
            Ok(n) if n == data.len() => Ok(data),
            Ok(_) => Err(ApplyError::Read(io::ErrorKind::UnexpectedEof.into())),
            Err(e) => Err(ApplyError::Read(e)),
        }
    }

    /// The next entry, or `None` at the end of the archive.
    pub(super) fn next(&mut self) -> Result<Option<Header>, ApplyError> {
        let mut pax: Option<BTreeMap<Vec<u8>, Vec<u8>>> = None;
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        loop {
            if !self.skip_current()? {
                return Ok(None);
            }
            let Some(block) = self.read_block()? else {
                return Ok(None);
            };
            if block.iter().all(|b| *b == 0) {
                return match self.read_block()? {
                    None => Ok(None),
                    Some(next) if next.iter().all(|b| *b == 0) => Ok(None),
                    Some(_) => Err(self.bad("a zero block followed by a non-zero block")),
                };
            }
            let mut hdr = parse_block(&block).map_err(|reason| self.bad(reason))?;
            let flag = block[156];
            self.set_data(flag, hdr.size)?;
            match flag {
                b'x' | b'g' => {
                    let data = self.read_special("PAX header", hdr.size)?;
                    let records = parse_pax(&data).map_err(|reason| self.bad(reason))?;
                    if flag == b'g' {
                        merge_pax(&mut hdr, &records).map_err(|reason| self.bad(reason))?;
                        hdr.kind = Kind::Global;
                        return Ok(Some(hdr));
                    }
                    pax = Some(records);
                }
                b'L' | b'K' => {
                    let data = self.read_special("GNU long name", hdr.size)?;
                    let name = until_nul(&data).to_vec();
                    if flag == b'L' {
                        long_name = Some(name);
                    } else {
                        long_link = Some(name);
                    }
                }
                b'S' => {
                    return Err(ApplyError::Sparse {
                        name: lossy(&hdr.name),
                    })
                }
                _ => {
                    if let Some(records) = &pax {
                        if records.keys().any(|k| k.starts_with(b"GNU.sparse.")) {
                            return Err(ApplyError::Sparse {
                                name: lossy(&hdr.name),
                            });
                        }
                        merge_pax(&mut hdr, records).map_err(|reason| self.bad(reason))?;
                    }
                    // Go: a GNU long name wins over PAX's, when not empty.
                    if let Some(name) = long_name.filter(|n| !n.is_empty()) {
                        hdr.name = name;
                    }
                    if let Some(link) = long_link.filter(|n| !n.is_empty()) {
                        hdr.linkname = link;
                    }
                    hdr.kind = Kind::of(flag, &hdr.name);
                    self.set_data(flag, hdr.size)?;
                    return Ok(Some(hdr));
                }
            }
        }
    }

    /// Sets up the current entry's data reader (Go's `handleRegularFile`).
    fn set_data(&mut self, flag: u8, size: i64) -> Result<(), ApplyError> {
        let n = if header_only(flag) { 0 } else { size };
        let n = u64::try_from(n).map_err(|_| self.bad("negative size"))?;
        self.remaining = n;
        self.pad = padding(n);
        Ok(())
    }
}

/// The current entry's data.
impl<R: Read> Read for TarReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let max = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.remaining -= n as u64;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Text for an error message.
pub(super) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn until_nul(b: &[u8]) -> &[u8] {
    b.iter().position(|c| *c == 0).map_or(b, |i| &b[..i])
}

fn trim(mut b: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = b {
        if *first == b' ' || *first == 0 {
            b = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = b {
        if *last == b' ' || *last == 0 {
            b = rest;
        } else {
            break;
        }
    }
    b
}

fn parse_octal(b: &[u8]) -> Result<i64, &'static str> {
    let b = until_nul(trim(b));
    if b.is_empty() {
        return Ok(0);
    }
    let text = std::str::from_utf8(b).map_err(|_| "a numeric field is not octal")?;
    if !text.bytes().all(|c| (b'0'..=b'7').contains(&c)) {
        return Err("a numeric field is not octal");
    }
    let v = u64::from_str_radix(text, 8).map_err(|_| "a numeric field overflows")?;
    // Go converts with int64(x): the same wrap-around.
    Ok(v as i64)
}

/// Octal, or base-256 (two's complement, big endian) when the first bit is set.
fn parse_numeric(b: &[u8]) -> Result<i64, &'static str> {
    let Some(first) = b.first() else {
        return Ok(0);
    };
    if first & 0x80 == 0 {
        return parse_octal(b);
    }
    let inv: u8 = if first & 0x40 != 0 { 0xff } else { 0 };
    let mut x: u64 = 0;
    for (i, c) in b.iter().enumerate() {
        let mut c = c ^ inv;
        if i == 0 {
            c &= 0x7f;
        }
        if x >> 56 > 0 {
            return Err("a base-256 field overflows");
        }
        x = x << 8 | u64::from(c);
    }
    if x >> 63 > 0 {
        return Err("a base-256 field overflows");
    }
    // x < 2^63 here.
    let v = x as i64;
    Ok(if inv == 0xff { !v } else { v })
}

fn parse_block(b: &[u8; BLOCK]) -> Result<Header, &'static str> {
    let stored = parse_octal(&b[148..156]).map_err(|_| "bad checksum field")?;
    let (mut unsigned, mut signed) = (0i64, 0i64);
    for (i, c) in b.iter().enumerate() {
        let c = if (148..156).contains(&i) { b' ' } else { *c };
        unsigned += i64::from(c);
        signed += i64::from(c as i8);
    }
    if stored != unsigned && stored != signed {
        return Err("header checksum mismatch");
    }
    let magic = &b[257..263];
    let version = &b[263..265];
    let star = magic == b"ustar\0" && &b[508..512] == b"tar\0";
    let ustar = magic == b"ustar\0" && !star;
    let gnu = magic == b"ustar " && version == b" \0";
    let mut hdr = Header {
        kind: Kind::Other(b[156]),
        name: until_nul(&b[0..100]).to_vec(),
        linkname: until_nul(&b[157..257]).to_vec(),
        size: parse_numeric(&b[124..136])?,
        mode: parse_numeric(&b[100..108])?,
        uid: parse_numeric(&b[108..116])?,
        gid: parse_numeric(&b[116..124])?,
        mtime: Time::from_secs(parse_numeric(&b[136..148])?),
        atime: None,
        devmajor: 0,
        devminor: 0,
        xattrs: BTreeMap::new(),
    };
    if !(ustar || star || gnu) {
        return Ok(hdr);
    }
    hdr.devmajor = parse_numeric(&b[329..337])?;
    hdr.devminor = parse_numeric(&b[337..345])?;
    let mut prefix: &[u8] = &[];
    if ustar {
        prefix = until_nul(&b[345..500]);
    } else if star {
        prefix = until_nul(&b[345..476]);
        hdr.atime = Some(Time::from_secs(parse_numeric(&b[476..488])?));
        parse_numeric(&b[488..500])?;
    } else {
        // GNU: access and change times where the prefix would be; a file whose fields do
        // not parse was written by an old Go with a prefix there (Go reads it as one).
        let atime = (b[345] != 0).then(|| parse_numeric(&b[345..357]));
        let ctime = (b[357] != 0).then(|| parse_numeric(&b[357..369]));
        match (atime.transpose(), ctime.transpose()) {
            (Ok(a), Ok(_)) => hdr.atime = a.map(Time::from_secs),
            _ => {
                let p = until_nul(&b[345..500]);
                if p.iter().all(|c| *c < 0x80) {
                    prefix = p;
                }
            }
        }
    }
    if !prefix.is_empty() {
        let mut name = prefix.to_vec();
        name.push(b'/');
        name.extend_from_slice(&hdr.name);
        hdr.name = name;
    }
    Ok(hdr)
}

/// PAX records (`"%d %s=%s\n"`), the later of two with one key winning.
fn parse_pax(mut s: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, &'static str> {
    const BAD: &str = "malformed PAX record";
    let mut out = BTreeMap::new();
    while !s.is_empty() {
        let sp = s.iter().position(|c| *c == b' ').ok_or(BAD)?;
        let len: i64 = std::str::from_utf8(&s[..sp])
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or(BAD)?;
        if len < 5 || len > s.len() as i64 {
            return Err(BAD);
        }
        // 5 <= len <= s.len() here.
        let len = len as usize;
        if len <= sp + 1 {
            return Err(BAD);
        }
        let rec = &s[sp + 1..len - 1];
        if s[len - 1] != b'\n' {
            return Err(BAD);
        }
        let eq = rec.iter().position(|c| *c == b'=').ok_or(BAD)?;
        let (key, value) = (&rec[..eq], &rec[eq + 1..]);
        let nul_in = |b: &[u8]| b.contains(&0);
        let valid = !key.is_empty()
            && match key {
                b"path" | b"linkpath" | b"uname" | b"gname" => !nul_in(value),
                _ => !nul_in(key),
            };
        if !valid {
            return Err(BAD);
        }
        out.insert(key.to_vec(), value.to_vec());
        s = &s[len..];
    }
    Ok(out)
}

/// Go's `parsePAXTime`: `[-]seconds[.fraction]`, the fraction cut to nanoseconds.
fn parse_pax_time(v: &[u8]) -> Result<Time, &'static str> {
    const BAD: &str = "malformed PAX time";
    let text = std::str::from_utf8(v).map_err(|_| BAD)?;
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = secs.parse().map_err(|_| BAD)?;
    if frac.is_empty() {
        return Ok(Time::from_secs(secs));
    }
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return Err(BAD);
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nanos: i128 = digits.parse().map_err(|_| BAD)?;
    let base = i128::from(secs) * 1_000_000_000;
    Ok(Time(if text.starts_with('-') {
        base - nanos
    } else {
        base + nanos
    }))
}

fn parse_pax_int(v: &[u8]) -> Result<i64, &'static str> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or("malformed PAX number")
}

/// Go's `mergePAX`: an empty value keeps the header's.
fn merge_pax(hdr: &mut Header, records: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<(), &'static str> {
    for (k, v) in records {
        if v.is_empty() {
            continue;
        }
        match k.as_slice() {
            b"path" => hdr.name = v.clone(),
            b"linkpath" => hdr.linkname = v.clone(),
            b"uid" => hdr.uid = parse_pax_int(v)?,
            b"gid" => hdr.gid = parse_pax_int(v)?,
            b"atime" => hdr.atime = Some(parse_pax_time(v)?),
            b"mtime" => hdr.mtime = parse_pax_time(v)?,
            b"ctime" => {
                parse_pax_time(v)?;
            }
            b"size" => hdr.size = parse_pax_int(v)?,
            key => {
                if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                    hdr.xattrs.insert(name.to_vec(), v.clone());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_as_go_parses_them() {
        assert_eq!(parse_numeric(b"0000644\0"), Ok(0o644));
        assert_eq!(parse_numeric(b"  644 \0"), Ok(0o644));
        assert_eq!(parse_numeric(b"\0\0\0\0"), Ok(0));
        assert!(parse_numeric(b"0008\0").is_err());
        assert_eq!(parse_numeric(&[0x80, 0, 0, 0, 0, 0, 0, 1]), Ok(1));
        assert_eq!(parse_numeric(&[0xff; 8]), Ok(-1));
        assert_eq!(parse_numeric(&[0x80, 1, 0, 0, 0, 0, 0, 0, 0]), Ok(1 << 56));
        assert!(parse_numeric(&[0x80, 1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn pax_records_and_times() {
        let recs = parse_pax(b"16 path=abcdefg\n13 mtime=1.5\n").unwrap();
        assert_eq!(recs[b"path".as_slice()], b"abcdefg");
        assert_eq!(parse_pax_time(b"1.5"), Ok(Time(1_500_000_000)));
        assert_eq!(parse_pax_time(b"-1.5"), Ok(Time(-1_500_000_000)));
        assert_eq!(parse_pax_time(b"2.1234567891"), Ok(Time(2_123_456_789)));
        assert!(parse_pax(b"99 path=x\n").is_err(), "length past the end");
        assert!(parse_pax(b"9 path=x\0").is_err(), "no newline");
        assert!(parse_pax(b"8 =abc\n\n").is_err(), "empty key");
        assert!(parse_pax(b"10 path=\0x\n").is_err(), "NUL in a path");
    }
}
