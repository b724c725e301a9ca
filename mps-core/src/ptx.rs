//! Module images: telling PTX, cubin and fatbin apart, and reading PTX kernel entries.
//!
//! The simulator binds each `.entry` of a PTX module to a built-in CPU implementation of the same
//! name; the layout of its parameters (offset and size of each, as `cuFuncGetParamInfo` reports
//! them on a GPU) comes from the `.param` list parsed here.

use crate::protocol::ParamInfo;
use crate::status::{Error, Result, Status};

/// What kind of module image a byte string is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    /// PTX assembly text.
    Ptx,
    /// An ELF cubin.
    Cubin,
    /// A fat binary.
    Fatbin,
}

const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();

impl ImageFormat {
    /// Recognises an image, or says why it is not one.
    pub fn detect(image: &[u8]) -> Result<ImageFormat> {
        if image.is_empty() {
            return Err(Error::invalid_value("module image is empty"));
        }
        if image.starts_with(b"\x7fELF") {
            return Ok(ImageFormat::Cubin);
        }
        if image.starts_with(&FATBIN_MAGIC) {
            return Ok(ImageFormat::Fatbin);
        }
        let text = ptx_text(image)?;
        if text.contains(".version") && text.contains(".target") {
            Ok(ImageFormat::Ptx)
        } else {
            Err(Error::new(
                Status::InvalidImage,
                "module image is not PTX (no .version/.target directives), cubin or fatbin",
            ))
        }
    }
}

fn ptx_text(image: &[u8]) -> Result<&str> {
    // PTX handed to cuModuleLoadData is NUL-terminated; accept it with or without the NUL.
    let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
    std::str::from_utf8(&image[..end]).map_err(|_| {
        Error::new(
            Status::InvalidImage,
            "module image is not PTX text (not UTF-8), cubin or fatbin",
        )
    })
}

/// One kernel entry of a PTX module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The entry's name as written in the PTX (mangled, unless declared `extern "C"`).
    pub name: String,
    /// Each parameter's offset and size in the packed parameter buffer.
    pub params: Vec<ParamInfo>,
}

impl Entry {
    /// Bytes of the packed parameter buffer.
    pub fn param_bytes(&self) -> u32 {
        self.params.last().map_or(0, |p| p.offset + p.size)
    }
}

/// Reads every `.entry` of a PTX module.
pub fn parse_entries(image: &[u8]) -> Result<Vec<Entry>> {
    parse_entries_within(image, usize::MAX)
}

/// Reads every `.entry` of a PTX module, refusing one with more than `most` before reading the
/// one past it.
pub fn parse_entries_within(image: &[u8], most: usize) -> Result<Vec<Entry>> {
    let text = strip_comments(ptx_text(image)?);
    let mut entries = Vec::new();
    let mut rest = text.as_str();
    while let Some(pos) = find_directive(rest, ".entry") {
        if entries.len() >= most {
            return Err(Error::new(
                Status::QuotaExceeded,
                format!("PTX with more than {most} kernel entries"),
            ));
        }
        rest = &rest[pos + ".entry".len()..];
        let open = rest
            .find('(')
            .ok_or_else(|| bad_ptx("an .entry without a parameter list"))?;
        let name = rest[..open].trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || "_$.".contains(c))
        {
            return Err(bad_ptx(format!(
                "an .entry with the malformed name {name:?}"
            )));
        }
        let close = rest[open..]
            .find(')')
            .ok_or_else(|| bad_ptx(format!("entry {name} has an unterminated parameter list")))?;
        let list = &rest[open + 1..open + close];
        let params = parse_params(name, list)?;
        entries.push(Entry {
            name: name.to_string(),
            params,
        });
        rest = &rest[open + close..];
    }
    Ok(entries)
}

fn bad_ptx(what: impl std::fmt::Display) -> Error {
    Error::new(Status::InvalidImage, format!("PTX module has {what}"))
}

/// Position of `directive` as a whole word.
fn find_directive(s: &str, directive: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(p) = s[from..].find(directive) {
        let at = from + p;
        let after = s[at + directive.len()..].chars().next();
        let before = s[..at].chars().next_back();
        if after.is_some_and(char::is_whitespace) && before.is_none_or(char::is_whitespace) {
            return Some(at);
        }
        from = at + directive.len();
    }
    None
}

/// The text without its comments: a `//` comment ends before its line's newline, a `/* */`
/// comment becomes one space. One pass over the text, whatever its comments (looking for the
/// next of each kind from every comment was quadratic: 256 KiB of `//` lines took 16 s).
fn strip_comments(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    // Start of the text not yet copied, and where the scan is.
    let (mut copied, mut i) = (0, 0);
    while i + 1 < b.len() {
        if b[i] != b'/' || (b[i + 1] != b'/' && b[i + 1] != b'*') {
            i += 1;
            continue;
        }
        out.push_str(&s[copied..i]);
        if b[i + 1] == b'/' {
            i = memchr(b'\n', &b[i..]).map_or(b.len(), |n| i + n);
        } else {
            out.push(' ');
            i = find(&b[i + 2..], b"*/").map_or(b.len(), |e| i + 2 + e + 2);
        }
        copied = i;
    }
    out.push_str(&s[copied.min(s.len())..]);
    out
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|c| *c == needle)
}

fn find(hay: &[u8], needle: &[u8; 2]) -> Option<usize> {
    hay.windows(2).position(|w| w == needle)
}

fn type_size(ty: &str) -> Option<u32> {
    Some(match ty {
        ".u8" | ".s8" | ".b8" => 1,
        ".u16" | ".s16" | ".b16" | ".f16" | ".bf16" => 2,
        ".u32" | ".s32" | ".b32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".u64" | ".s64" | ".b64" | ".f64" => 8,
        _ => return None,
    })
}

fn parse_params(entry: &str, list: &str) -> Result<Vec<ParamInfo>> {
    let mut params = Vec::new();
    let mut offset = 0u32;
    for decl in list.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bad = || {
            bad_ptx(format!(
                "entry {entry} with the unreadable parameter {decl:?}"
            ))
        };
        let mut tokens = decl.split_whitespace();
        if tokens.next() != Some(".param") {
            return Err(bad());
        }
        let mut align = None;
        let mut elem = None;
        let mut name = None;
        while let Some(t) = tokens.next() {
            if t == ".align" {
                let n: u32 = tokens.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
                // An .align before the type aligns the parameter; after `.ptr` it describes the
                // pointee and does not change the layout.
                if elem.is_none() {
                    align = Some(n);
                }
            } else if let Some(sz) = type_size(t) {
                elem = Some(sz);
            } else if t.starts_with('.') {
                // .ptr, .global, .const, ...: qualifiers of a pointer parameter.
            } else {
                name = Some(t);
            }
        }
        let (elem, name) = (elem.ok_or_else(bad)?, name.ok_or_else(bad)?);
        let count = match name.find('[') {
            Some(i) => name[i + 1..]
                .strip_suffix(']')
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or_else(bad)?,
            None => 1,
        };
        let align = align.unwrap_or(elem).max(1);
        if !align.is_power_of_two() {
            return Err(bad());
        }
        let size = elem.checked_mul(count).ok_or_else(bad)?;
        offset = offset.div_ceil(align).checked_mul(align).ok_or_else(bad)?;
        params.push(ParamInfo { offset, size });
        offset = offset.checked_add(size).ok_or_else(bad)?;
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
//
// Generated by NVIDIA NVVM Compiler
.version 8.8
.target sm_90
.address_size 64

	// .globl	fill_u32
.visible .entry fill_u32(
	.param .u64 .ptr .global .align 4 fill_u32_param_0,
	.param .u32 fill_u32_param_1,
	.param .u64 fill_u32_param_2
)
{
	ret;
}
/* a block comment mentioning .entry fake( */
.visible .entry saxpy_f32(
	.param .f32 saxpy_f32_param_0,
	.param .u64 saxpy_f32_param_1,
	.param .u64 saxpy_f32_param_2,
	.param .u64 saxpy_f32_param_3
)
.maxntid 256, 1, 1
{ ret; }
.entry no_params()
{ ret; }
.visible .entry with_struct(
	.param .align 8 .b8 with_struct_param_0[24],
	.param .u8 with_struct_param_1,
	.param .u16 with_struct_param_2
)
{ ret; }
"#;

    #[test]
    fn entries_and_layouts_are_read() {
        assert_eq!(
            ImageFormat::detect(SAMPLE.as_bytes()).unwrap(),
            ImageFormat::Ptx
        );
        let e = parse_entries(SAMPLE.as_bytes()).unwrap();
        let names: Vec<_> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["fill_u32", "saxpy_f32", "no_params", "with_struct"]);
        let p = |o, s| ParamInfo { offset: o, size: s };
        assert_eq!(e[0].params, [p(0, 8), p(8, 4), p(16, 8)]);
        assert_eq!(e[0].param_bytes(), 24);
        assert_eq!(e[1].params, [p(0, 4), p(8, 8), p(16, 8), p(24, 8)]);
        assert!(e[2].params.is_empty());
        assert_eq!(e[3].params, [p(0, 24), p(24, 1), p(26, 2)]);
    }

    #[test]
    fn formats_are_told_apart() {
        assert_eq!(
            ImageFormat::detect(b"\x7fELF\x02\x01").unwrap(),
            ImageFormat::Cubin
        );
        assert_eq!(
            ImageFormat::detect(&[0x50, 0xED, 0x55, 0xBA, 1, 0]).unwrap(),
            ImageFormat::Fatbin
        );
        let mut nul_terminated = SAMPLE.as_bytes().to_vec();
        nul_terminated.push(0);
        assert_eq!(
            ImageFormat::detect(&nul_terminated).unwrap(),
            ImageFormat::Ptx
        );
        for junk in [&b"hello world"[..], &[0xff, 0xfe, 0x00], b""] {
            let e = ImageFormat::detect(junk).unwrap_err();
            assert!(matches!(
                e.status,
                Status::InvalidImage | Status::InvalidValue
            ));
        }
    }

    #[test]
    fn malformed_params_are_errors() {
        for bad in [
            ".version 8.0\n.target sm_90\n.entry k(.param .u99 x)\n{}",
            ".version 8.0\n.target sm_90\n.entry k(.param .u32)\n{}",
            ".version 8.0\n.target sm_90\n.entry k(.param .b8 x[zz])\n{}",
            ".version 8.0\n.target sm_90\n.entry k(.param .align 3 .b8 x[4])\n{}",
            ".version 8.0\n.target sm_90\n.entry k(.param .u32 x\n",
            ".version 8.0\n.target sm_90\n.entry (.param .u32 x)\n",
        ] {
            let e = parse_entries(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status, Status::InvalidImage, "{bad}: {e}");
        }
    }
}
