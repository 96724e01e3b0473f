//! The layer stream: decompressed by its magic bytes, and hashed as it is read.

use std::io::{self, Cursor, Read};

use sha2::{Digest, Sha256};

use super::error::ApplyError;

/// How a layer is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip (one or more members, as Go's reader reads them).
    Gzip,
    /// zstd (one or more frames).
    Zstd,
}

const GZIP: &[u8] = &[0x1f, 0x8b, 0x08];
const ZSTD: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Reads the first bytes of `layer` to tell its compression, and returns the decompressed
/// stream (the bytes read put back in front). Anything that is neither gzip nor zstd is
/// read as a plain tar, as containerd's `DecompressStream` does.
pub(super) fn decompress<'a>(
    mut layer: impl Read + Send + 'a,
) -> Result<(Compression, Box<dyn Read + Send + 'a>), ApplyError> {
    let mut head = [0u8; 4];
    let mut n = 0;
    while n < head.len() {
        match layer.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ApplyError::Read(e)),
        }
    }
    let head = &head[..n];
    let compression = if head.starts_with(GZIP) {
        Compression::Gzip
    } else if head.starts_with(ZSTD) {
        Compression::Zstd
    } else {
        Compression::None
    };
    let whole = Cursor::new(head.to_vec()).chain(layer);
    let out: Box<dyn Read + Send + 'a> = match compression {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(whole)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::new(whole).map_err(ApplyError::Read)?)
        }
        Compression::None => Box::new(whole),
    };
    Ok((compression, out))
}

/// Hashes and counts what is read through it: the layer's diff ID.
pub(super) struct Hashing<R> {
    inner: R,
    sha: Sha256,
    bytes: u64,
}

impl<R: Read> Hashing<R> {
    pub(super) fn new(inner: R) -> Self {
        Self {
            inner,
            sha: Sha256::new(),
            bytes: 0,
        }
    }

    /// `sha256:<hex>` of what was read, and its length. containerd hashes the whole
    /// stream, past the tar's end: the caller reads it to its end first.
    pub(super) fn digest(self) -> (String, u64) {
        (
            format!("sha256:{}", hex::encode(self.sha.finalize())),
            self.bytes,
        )
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}
