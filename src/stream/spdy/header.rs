//! SPDY/3 name/value header blocks and their compression.
//!
//! A block is a 32-bit count followed by (32-bit length, name, 32-bit length, value) pairs;
//! several values of one name are joined by NUL. Blocks are zlib-compressed with the SPDY/3
//! preset dictionary, and — the part that is easy to get wrong — each direction of a session
//! is ONE zlib stream: every block is compressed with a sync flush and the next block
//! continues the same stream, so the decompressor must also be kept for the whole session
//! and fed the blocks in wire order. A fresh inflater per block fails on the second block.
//!
//! The dictionary is built here from the spec's word list (length-prefixed words, then a tail
//! of status codes, dates and content types); the tests pin its length and Adler-32, the id
//! that a peer's zlib header names.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The largest decompressed header block accepted: kubelet's blocks are a few dozen bytes,
/// so this only stops a compression bomb.
pub(crate) const MAX_HEADER_BLOCK: usize = 256 * 1024;

/// The words of the SPDY/3 dictionary, each written as a 32-bit length and the word.
const WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's tail, written as is.
const TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

const fn dictionary_len() -> usize {
    let mut n = TAIL.len();
    let mut i = 0;
    while i < WORDS.len() {
        n += 4 + WORDS[i].len();
        i += 1;
    }
    n
}

/// The SPDY/3 header compression dictionary (1423 bytes).
pub(crate) const DICTIONARY: [u8; dictionary_len()] = build_dictionary();

const fn build_dictionary() -> [u8; dictionary_len()] {
    let mut out = [0u8; dictionary_len()];
    let mut at = 0;
    let mut i = 0;
    while i < WORDS.len() {
        let word = WORDS[i].as_bytes();
        let len = (word.len() as u32).to_be_bytes();
        let mut k = 0;
        while k < 4 {
            out[at] = len[k];
            at += 1;
            k += 1;
        }
        k = 0;
        while k < word.len() {
            out[at] = word[k];
            at += 1;
            k += 1;
        }
        i += 1;
    }
    let tail = TAIL.as_bytes();
    let mut k = 0;
    while k < tail.len() {
        out[at] = tail[k];
        at += 1;
        k += 1;
    }
    out
}

/// The headers of one block, in wire order; names lower case.
pub type Headers = Vec<(String, String)>;

/// What is wrong with a header block.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    /// zlib rejected the compressed bytes (or they name another dictionary).
    #[error("header block decompression: {0}")]
    Inflate(String),
    /// zlib failed compressing (not expected with in-memory buffers).
    #[error("header block compression: {0}")]
    Deflate(String),
    /// The decompressed block exceeds [`MAX_HEADER_BLOCK`].
    #[error("header block larger than {MAX_HEADER_BLOCK} bytes")]
    TooLarge,
    /// The compressed bytes of a frame did not hold a complete block.
    #[error("header block truncated")]
    Truncated,
    /// Bytes follow the block's last pair.
    #[error("{0} bytes after the header block's last pair")]
    Trailing(usize),
    /// A name or value does not fit a 32-bit length, or too many pairs.
    #[error("header block too large to encode")]
    Encode,
}

/// Writes `headers` as an uncompressed name/value block.
pub(crate) fn write_block(
    headers: &[(String, String)],
    out: &mut Vec<u8>,
) -> Result<(), HeaderError> {
    let count = u32::try_from(headers.len()).map_err(|_| HeaderError::Encode)?;
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in headers {
        for field in [name.as_bytes(), value.as_bytes()] {
            let len = u32::try_from(field.len()).map_err(|_| HeaderError::Encode)?;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(field);
        }
    }
    Ok(())
}

/// Parses an uncompressed name/value block. Names are lower-cased (SPDY/3 requires lower
/// case; a client that sends otherwise is taken at its word rather than refused); bytes that
/// are not UTF-8 are replaced.
pub(crate) fn parse_block(block: &[u8]) -> Result<Headers, HeaderError> {
    let mut rest = block;
    let count = take_u32(&mut rest)?;
    // Each pair takes at least 8 bytes: a count beyond that is a lie, not a reason to allocate.
    if count as usize > rest.len() / 8 {
        return Err(HeaderError::Truncated);
    }
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let name = take_field(&mut rest)?;
        let value = take_field(&mut rest)?;
        headers.push((
            String::from_utf8_lossy(name).to_ascii_lowercase(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
    if !rest.is_empty() {
        return Err(HeaderError::Trailing(rest.len()));
    }
    Ok(headers)
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, HeaderError> {
    let (head, tail) = rest
        .split_first_chunk::<4>()
        .ok_or(HeaderError::Truncated)?;
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_field<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], HeaderError> {
    let len = take_u32(rest)? as usize;
    if len > rest.len() {
        return Err(HeaderError::Truncated);
    }
    let (field, tail) = rest.split_at(len);
    *rest = tail;
    Ok(field)
}

/// One direction's compressor: one zlib stream for the session.
pub(crate) struct HeaderEncoder {
    deflate: Compress,
    raw: Vec<u8>,
}

impl HeaderEncoder {
    pub(crate) fn new() -> Result<Self, HeaderError> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&DICTIONARY)
            .map_err(|e| HeaderError::Deflate(e.to_string()))?;
        Ok(HeaderEncoder {
            deflate,
            raw: Vec::new(),
        })
    }

    /// Appends the compressed block of `headers` to `out`, sync-flushed so the peer can
    /// decompress it alone (continuing its stream).
    pub(crate) fn encode(
        &mut self,
        headers: &[(String, String)],
        out: &mut Vec<u8>,
    ) -> Result<(), HeaderError> {
        self.raw.clear();
        write_block(headers, &mut self.raw)?;
        let mut input = &self.raw[..];
        loop {
            // Room for the worst case of a stored block plus the flush marker.
            out.reserve(input.len() + 64);
            let before_in = self.deflate.total_in();
            let spare = out.capacity() - out.len();
            let before_out = out.len();
            self.deflate
                .compress_vec(input, out, FlushCompress::Sync)
                .map_err(|e| HeaderError::Deflate(e.to_string()))?;
            let consumed = (self.deflate.total_in() - before_in) as usize;
            input = &input[consumed..];
            let produced = out.len() - before_out;
            // Done once all input is in and zlib did not fill the room it had (nothing pending).
            if input.is_empty() && produced < spare {
                return Ok(());
            }
        }
    }
}

/// One direction's decompressor: one zlib stream for the session.
pub(crate) struct HeaderDecoder {
    inflate: Decompress,
    out: Vec<u8>,
}

impl HeaderDecoder {
    pub(crate) fn new() -> Self {
        HeaderDecoder {
            inflate: Decompress::new(true),
            out: Vec::new(),
        }
    }

    /// What the decompressed-block buffer holds allocated (at most [`MAX_HEADER_BLOCK`] + 1).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.out.capacity()
    }

    /// Decompresses the next block (continuing the session's stream) and parses it. The
    /// output buffer never grows past [`MAX_HEADER_BLOCK`] + 1 bytes, whatever the input.
    pub(crate) fn decode(&mut self, compressed: &[u8]) -> Result<Headers, HeaderError> {
        self.out.clear();
        let mut input = compressed;
        loop {
            if self.out.capacity() - self.out.len() < 4096 {
                // Never more room than the bound allows (one byte past it, to notice a block
                // that exceeds it): a small compressed input can claim megabytes.
                let room = (MAX_HEADER_BLOCK + 1).saturating_sub(self.out.len());
                self.out.reserve_exact(4096.max(input.len() * 2).min(room));
            }
            let spare = self.out.capacity() - self.out.len();
            let before_in = self.inflate.total_in();
            let before_out = self.out.len();
            let mut dictionary_set = false;
            let status =
                match self
                    .inflate
                    .decompress_vec(input, &mut self.out, FlushDecompress::Sync)
                {
                    Ok(status) => status,
                    Err(e) if e.needs_dictionary().is_some() => {
                        // The zlib header named a dictionary: ours, or set_dictionary fails on
                        // the Adler-32 mismatch.
                        self.inflate
                            .set_dictionary(&DICTIONARY)
                            .map_err(|e| HeaderError::Inflate(e.to_string()))?;
                        dictionary_set = true;
                        Status::Ok
                    }
                    Err(e) => return Err(HeaderError::Inflate(e.to_string())),
                };
            let consumed = (self.inflate.total_in() - before_in) as usize;
            input = &input[consumed..];
            let produced = self.out.len() - before_out;
            if self.out.len() > MAX_HEADER_BLOCK {
                return Err(HeaderError::TooLarge);
            }
            if status == Status::StreamEnd && !input.is_empty() {
                // The peer ended its zlib stream (SPDY never does) and sent more.
                return Err(HeaderError::Inflate(
                    "data after the end of the zlib stream".into(),
                ));
            }
            // Done once all input is in and zlib did not fill the room it had.
            if input.is_empty() && produced < spare {
                break;
            }
            if consumed == 0 && produced == 0 && !dictionary_set {
                // Room to write, input left, and no progress: zlib cannot go on.
                return Err(HeaderError::Inflate("no progress".into()));
            }
        }
        parse_block(&self.out)
    }
}
