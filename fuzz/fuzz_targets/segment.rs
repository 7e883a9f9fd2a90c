//! The segment decoder (a `ProviderResponse`): no panic on any input; a decoded
//! response written out canonically decodes again to the same canonical text.
#![no_main]

use _core::json::{write_str, Limits};
use _core::segment::{decode, Args, ResponseIndex, SegmentIndex};
use libfuzzer_sys::fuzz_target;
use openstarry_core_fuzz::{encode, raw_value};

struct Writer<'a> {
    buf: &'a [u8],
    limits: Limits,
    out: Vec<u8>,
    first: bool,
}

impl Writer<'_> {
    fn key(&mut self, name: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        write_str(&mut self.out, name);
        self.out.push(b':');
    }

    fn raw(&mut self, range: (usize, usize)) {
        let value = raw_value(self.buf, range, &self.limits);
        encode(&value, &mut self.out);
    }

    fn open(&mut self) {
        self.out.push(b'{');
        self.first = true;
    }

    fn close(&mut self) {
        self.out.push(b'}');
        self.first = false;
    }

    fn string(&mut self, name: &str, span: Option<_core::json::Span>) {
        if let Some(span) = span {
            self.key(name);
            let text = span.as_str(self.buf);
            write_str(&mut self.out, &text);
        }
    }

    fn segment(&mut self, seg: &SegmentIndex) {
        self.open();
        self.key("type");
        write_str(&mut self.out, seg.kind.as_str());
        self.string("text", seg.text);
        self.string("data", seg.data);
        self.string("mimeType", seg.mime_type);
        if let Some(ui) = seg.ui {
            self.key("ui");
            self.raw(ui);
        }
        if let Some(call) = &seg.tool_call {
            self.key("toolCall");
            self.open();
            self.string("id", call.id);
            self.string("name", Some(call.name));
            match &call.args {
                Args::Missing => {}
                Args::Value(range) => {
                    self.key("args");
                    self.raw(*range);
                }
                Args::Text(text) => {
                    self.key("args");
                    write_str(&mut self.out, text);
                }
            }
            for (key, range) in &call.extra {
                self.key(&key.as_str(self.buf));
                self.raw(*range);
            }
            self.close();
        }
        for (key, range) in &seg.extra {
            self.key(&key.as_str(self.buf));
            self.raw(*range);
        }
        self.close();
    }
}

/// The canonical text of a decoded response.
fn canonical(buf: &[u8], index: &ResponseIndex, limits: Limits) -> Vec<u8> {
    let mut w = Writer {
        buf,
        limits,
        out: Vec::new(),
        first: true,
    };
    w.open();
    w.key("segments");
    w.out.push(b'[');
    for (i, seg) in index.segments.iter().enumerate() {
        if i > 0 {
            w.out.push(b',');
        }
        w.segment(seg);
    }
    w.out.push(b']');
    w.first = false;
    if let Some(metadata) = index.metadata {
        w.key("metadata");
        w.raw(metadata);
    }
    for (key, range) in &index.extra {
        w.key(&key.as_str(buf));
        w.raw(*range);
    }
    w.close();
    w.out
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_depth: 64,
    };
    let Ok(first) = decode(data, &limits) else {
        return;
    };
    let encoded = canonical(data, &first, limits);
    let wide = Limits {
        max_bytes: limits.max_bytes * 7,
        max_depth: limits.max_depth,
    };
    let second = match decode(&encoded, &wide) {
        Ok(second) => second,
        Err(e) => panic!(
            "a decoded response, written out again, does not decode: {e}\n{}",
            String::from_utf8_lossy(&encoded)
        ),
    };
    assert_eq!(first.segments.len(), second.segments.len());
    let again = canonical(&encoded, &second, wide);
    assert_eq!(
        String::from_utf8_lossy(&again),
        String::from_utf8_lossy(&encoded),
        "decode → encode → decode is not stable"
    );
});
