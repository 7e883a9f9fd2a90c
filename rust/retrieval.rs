//! Lexical tool retrieval: which of many tools best match an input (spec 000 section 6B).
//!
//! A [`ToolIndex`] is built once from `(name, text)` documents, one per tool,
//! and answers [`ToolIndex::search`] with the best-scoring names. Scoring is
//! BM25F over two fields, the name (boosted) and the text (a description,
//! parameter names and their descriptions):
//!
//! ```text
//! tf~(t, d)   = sum over fields f of  w_f * tf_f(t, d) / (1 - b_f + b_f * len_f(d) / avglen_f)
//! score(t, d) = idf(t) * tf~ / (k1 + tf~),   idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
//! ```
//!
//! and a document's score is the sum over the query's distinct terms. Every
//! per-(term, document) weight is computed when the index is built, so a search
//! only adds up posting lists.
//!
//! # Terms
//!
//! [`tokenize`] splits text on anything that is not a letter or a digit and on
//! `camelCase` boundaries (so `crm.contacts.search`, `get_weather` and
//! `getHTTPResponse` all come apart, while an acronym's plural stays one word
//! without its `s`: `listAPIs` is `list api`), lowercases, drops a short list of English
//! stop words and strips common English suffixes with [`stem`] (`weathers`,
//! `reading`, `created` become `weather`, `read`, `creat`). A few verbs that
//! name a tool's usual operations are followed by the operation's term (`add`
//! by `creat`, `remove` by `delet`: see `ACTION_SYNONYMS`). Runs of Chinese,
//! Japanese kana or kanji, which are written without spaces, become overlapping
//! character pairs.
//!
//! A query term of three characters or more also matches the indexed terms it
//! is a prefix of (`auth` finds `authenticate`), at [`PREFIX_WEIGHT`] of their
//! weight; a document takes the best of a term's exact and prefix matches.
//!
//! # Ties
//!
//! Results are ordered by score, highest first, then by name, so the same
//! index and query always give the same list.

use std::fmt;

/// The most documents one index holds.
pub const MAX_DOCUMENTS: usize = 100_000;
/// The longest document name, in UTF-8 bytes.
pub const MAX_NAME_BYTES: usize = 1_024;
/// The longest document text, in UTF-8 bytes.
pub const MAX_TEXT_BYTES: usize = 65_536;
/// The longest query, in UTF-8 bytes.
pub const MAX_QUERY_BYTES: usize = 65_536;

/// BM25 saturation: how quickly repeated occurrences of a term stop adding.
const K1: f64 = 1.2;
/// How much more a term counts in the name than in the text.
const NAME_WEIGHT: f64 = 3.0;
const TEXT_WEIGHT: f64 = 1.0;
/// Length normalisation per field: names are short and similar, texts vary.
const NAME_B: f64 = 0.5;
const TEXT_B: f64 = 0.75;
/// What a prefix match is worth, against an exact match of the same term.
pub const PREFIX_WEIGHT: f64 = 0.5;
/// A query term needs this many characters to match as a prefix.
pub const MIN_PREFIX_CHARS: usize = 3;
/// At most this many indexed terms are matched by one prefix (in term order).
pub const MAX_PREFIX_EXPANSIONS: usize = 64;

/// Words too common in requests and descriptions to tell tools apart.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "could", "do", "for", "from", "i",
    "in", "is", "it", "its", "me", "my", "of", "on", "or", "our", "please", "that", "the", "this",
    "to", "we", "will", "with", "would", "you", "your",
];

/// Verbs of requests and descriptions, stemmed, that stand for a tool's usual
/// operations, and the stem of the operation: `add` also counts as `create`.
/// Only words that are hardly ever anything but these verbs are listed.
const ACTION_SYNONYMS: &[(&str, &str)] = &[
    ("add", "creat"),
    ("chang", "updat"),
    ("destroy", "delet"),
    ("download", "export"),
    ("edit", "updat"),
    ("eras", "delet"),
    ("fetch", "get"),
    ("find", "search"),
    ("generat", "creat"),
    ("insert", "creat"),
    ("lookup", "search"),
    ("mak", "creat"),
    ("modify", "updat"),
    ("purg", "delet"),
    ("remov", "delet"),
    ("retriev", "get"),
];

/// Why an index could not be built or a query not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetrievalError {
    /// More than [`MAX_DOCUMENTS`] documents.
    TooManyDocuments(usize),
    /// A document's name is empty.
    EmptyName(usize),
    /// A document's name is longer than [`MAX_NAME_BYTES`].
    NameTooLong { index: usize, len: usize },
    /// A document's text is longer than [`MAX_TEXT_BYTES`].
    TextTooLong { name: String, len: usize },
    /// Two documents share a name.
    DuplicateName(String),
    /// A query longer than [`MAX_QUERY_BYTES`].
    QueryTooLong(usize),
}

impl fmt::Display for RetrievalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyDocuments(n) => {
                write!(
                    f,
                    "{n} documents, more than the {MAX_DOCUMENTS} an index holds"
                )
            }
            Self::EmptyName(i) => write!(f, "document {i} has an empty name"),
            Self::NameTooLong { index, len } => write!(
                f,
                "document {index}'s name is {len} bytes, more than the {MAX_NAME_BYTES} allowed"
            ),
            Self::TextTooLong { name, len } => write!(
                f,
                "the text of {name:?} is {len} bytes, more than the {MAX_TEXT_BYTES} allowed"
            ),
            Self::DuplicateName(name) => write!(f, "two documents are named {name:?}"),
            Self::QueryTooLong(len) => write!(
                f,
                "the query is {len} bytes, more than the {MAX_QUERY_BYTES} allowed"
            ),
        }
    }
}

impl std::error::Error for RetrievalError {}

/// Chinese, Japanese kana and kanji: scripts written without spaces between words.
fn is_unspaced(c: char) -> bool {
    matches!(
        c as u32,
        0x3040..=0x30FF      // hiragana, katakana
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0x20000..=0x2FFFF // CJK extensions B onwards
    )
}

/// The terms of `text`, in order, repeats kept: see the module documentation.
#[must_use]
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_term(text, |term| out.push(term.to_owned()));
    out
}

/// Call `f` with each term of `text`, in order, repeats kept (no allocation per term).
pub fn for_each_term(text: &str, mut f: impl FnMut(&str)) {
    let mut scratch = Scratch::default();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_unspaced(c) {
            let start = i;
            while i < chars.len() && is_unspaced(chars[i]) {
                i += 1;
            }
            unspaced(&chars[start..i], &mut scratch, &mut f);
        } else if c.is_alphanumeric() {
            let start = i;
            while i < chars.len() && chars[i].is_alphanumeric() && !is_unspaced(chars[i]) {
                i += 1;
            }
            word(&chars[start..i], &mut scratch, &mut f);
        } else {
            i += 1;
        }
    }
}

/// Buffers reused from one term to the next.
#[derive(Default)]
struct Scratch {
    lower: String,
    stemmed: Vec<u8>,
}

/// Overlapping pairs of a run of unspaced characters; a single one alone.
fn unspaced(run: &[char], scratch: &mut Scratch, f: &mut impl FnMut(&str)) {
    if run.len() == 1 {
        scratch.lower.clear();
        scratch.lower.push(run[0]);
        f(&scratch.lower);
    } else {
        for pair in run.windows(2) {
            scratch.lower.clear();
            scratch.lower.extend(pair);
            f(&scratch.lower);
        }
    }
}

/// A run of letters and digits, split at `camelCase` boundaries, each part a term.
fn word(chars: &[char], scratch: &mut Scratch, f: &mut impl FnMut(&str)) {
    let mut start = 0;
    for i in 1..chars.len() {
        let (prev, cur) = (chars[i - 1], chars[i]);
        let split = cur.is_uppercase()
            && (prev.is_lowercase()
                || prev.is_numeric()
                // The last capital of an acronym starts the next word: HTTPServer,
                // unless it is the acronym's plural: listAPIs, getURLsByTag.
                || (prev.is_uppercase()
                    && i - start >= 2
                    && chars.get(i + 1).is_some_and(|n| n.is_lowercase())
                    && !acronym_plural(chars, i)));
        if split {
            part(&chars[start..i], scratch, f);
            start = i;
        }
    }
    part(&chars[start..], scratch, f);
}

/// Whether `chars[i]` is the last capital of an acronym followed by a plural
/// `s` that ends the word or the camelCase part (`APIs`, `URLsBy`).
fn acronym_plural(chars: &[char], i: usize) -> bool {
    chars.get(i + 1) == Some(&'s') && chars.get(i + 2).is_none_or(|n| !n.is_lowercase())
}

/// One camelCase part as a term; an acronym's plural (`APIs`, `IDs`) loses its
/// `s`, which the stemmer would keep after `i` (as in `analysis`).
fn part(chars: &[char], scratch: &mut Scratch, f: &mut impl FnMut(&str)) {
    match chars.split_last() {
        Some(('s', acronym)) if acronym.len() >= 2 && acronym.iter().all(|c| c.is_uppercase()) => {
            term(acronym, scratch, f);
        }
        _ => term(chars, scratch, f),
    }
}

fn term(part: &[char], scratch: &mut Scratch, f: &mut impl FnMut(&str)) {
    let lower = &mut scratch.lower;
    lower.clear();
    for &c in part {
        if c.is_ascii() {
            lower.push(c.to_ascii_lowercase());
        } else {
            lower.extend(c.to_lowercase());
        }
    }
    if lower.is_empty() || STOP_WORDS.binary_search(&lower.as_str()).is_ok() {
        return;
    }
    let term = if lower.is_ascii() && lower.len() > 3 {
        scratch.stemmed.clear();
        scratch.stemmed.extend_from_slice(lower.as_bytes());
        stem_ascii(&mut scratch.stemmed);
        // Only ASCII bytes were removed from ASCII text.
        std::str::from_utf8(&scratch.stemmed).unwrap_or(lower)
    } else {
        lower.as_str()
    };
    f(term);
    if let Ok(i) = ACTION_SYNONYMS.binary_search_by(|(word, _)| (*word).cmp(term)) {
        f(ACTION_SYNONYMS[i].1);
    }
}

fn is_vowel(b: u8) -> bool {
    matches!(b, b'a' | b'e' | b'i' | b'o' | b'u' | b'y')
}

/// A light English stemmer for one lowercase word; other scripts pass unchanged.
///
/// Plurals (`-s`, `-es`, `-ies`), then `-ing` and `-ed` (undoubling a final
/// consonant: `running` → `run`), then a final `-e`: so `create`, `creates`,
/// `created` and `creating` all become `creat`. A suffix is only removed when
/// what remains has a vowel and at least three letters.
#[must_use]
pub fn stem(word: &str) -> String {
    if !word.is_ascii() || word.len() <= 3 {
        return word.to_owned();
    }
    let mut w = word.as_bytes().to_vec();
    stem_ascii(&mut w);
    // Only ASCII bytes were removed from an ASCII word.
    String::from_utf8(w).unwrap_or_else(|_| word.to_owned())
}

/// [`stem`] in place, for an ASCII word of more than three letters.
fn stem_ascii(w: &mut Vec<u8>) {
    plural(w);
    if !verb_suffix(w) && w.len() > 3 && w.last() == Some(&b'e') {
        w.pop();
    }
}

fn plural(w: &mut Vec<u8>) {
    if w.ends_with(b"ies") && w.len() > 4 {
        w.truncate(w.len() - 3);
        w.push(b'y');
    } else if w.ends_with(b"sses")
        || w.ends_with(b"shes")
        || w.ends_with(b"ches")
        || w.ends_with(b"xes")
    {
        w.truncate(w.len() - 2);
    } else if w.ends_with(b"s")
        && !w.ends_with(b"ss")
        && !w.ends_with(b"us")
        && !w.ends_with(b"is")
        && w.len() > 3
    {
        w.pop();
    }
}

/// Strip `-ing` or `-ed`; true when one was stripped (the `-e` rule is then skipped).
fn verb_suffix(w: &mut Vec<u8>) -> bool {
    let cut = if w.ends_with(b"ing") {
        3
    } else if w.ends_with(b"ied") && w.len() > 4 {
        w.truncate(w.len() - 3);
        w.push(b'y');
        return true;
    } else if w.ends_with(b"ed") && !w.ends_with(b"eed") {
        2
    } else {
        return false;
    };
    let stem = &w[..w.len() - cut];
    if stem.len() < 3 || !stem.iter().copied().any(is_vowel) {
        return false;
    }
    w.truncate(w.len() - cut);
    let n = w.len();
    // Undouble (`running`, `stopped`) unless too little would be left (`adding`).
    if n > 3
        && w[n - 1] == w[n - 2]
        && !is_vowel(w[n - 1])
        && !matches!(w[n - 1], b'l' | b's' | b'z')
    {
        w.pop();
    }
    true
}

/// A document's term ids, sorted, per field.
struct Fields {
    name: Vec<u32>,
    text: Vec<u32>,
}

/// Each id and how often it occurs in a sorted list: `(id, count)`.
fn runs(ids: &[u32]) -> impl Iterator<Item = (u32, u32)> + '_ {
    ids.chunk_by(|a, b| a == b).map(|r| (r[0], r.len() as u32))
}

/// A BM25F index of named documents; immutable once built.
pub struct ToolIndex {
    names: Vec<String>,
    /// Every indexed term, sorted (binary search for exact and prefix matches).
    terms: Vec<Box<str>>,
    /// `postings[offsets[i]..offsets[i + 1]]` are term `i`'s (document, weight) pairs.
    offsets: Vec<usize>,
    postings: Vec<(u32, f64)>,
}

impl ToolIndex {
    /// Index `documents`, each a `(name, text)` pair.
    ///
    /// # Errors
    ///
    /// A [`RetrievalError`] for too many documents, an empty, over-long or
    /// repeated name, or an over-long text.
    pub fn new<N, T>(documents: &[(N, T)]) -> Result<Self, RetrievalError>
    where
        N: AsRef<str>,
        T: AsRef<str>,
    {
        if documents.len() > MAX_DOCUMENTS {
            return Err(RetrievalError::TooManyDocuments(documents.len()));
        }
        let mut seen = foldhash::HashSet::default();
        for (index, (name, text)) in documents.iter().enumerate() {
            let (name, text) = (name.as_ref(), text.as_ref());
            if name.is_empty() {
                return Err(RetrievalError::EmptyName(index));
            }
            if name.len() > MAX_NAME_BYTES {
                return Err(RetrievalError::NameTooLong {
                    index,
                    len: name.len(),
                });
            }
            if text.len() > MAX_TEXT_BYTES {
                return Err(RetrievalError::TextTooLong {
                    name: name.to_owned(),
                    len: text.len(),
                });
            }
            if !seen.insert(name) {
                return Err(RetrievalError::DuplicateName(name.to_owned()));
            }
        }
        // Term ids in order of first appearance, and each document's ids per field.
        let mut vocab: foldhash::HashMap<Box<str>, u32> = foldhash::HashMap::default();
        let mut spelled: Vec<Box<str>> = Vec::new();
        let mut intern = |term: &str, ids: &mut Vec<u32>| {
            let id = if let Some(&id) = vocab.get(term) {
                id
            } else {
                let id = spelled.len() as u32;
                vocab.insert(term.into(), id);
                spelled.push(term.into());
                id
            };
            ids.push(id);
        };
        let fields: Vec<Fields> = documents
            .iter()
            .map(|(name, text)| {
                let (mut n, mut t) = (Vec::new(), Vec::new());
                for_each_term(name.as_ref(), |term| intern(term, &mut n));
                for_each_term(text.as_ref(), |term| intern(term, &mut t));
                Fields { name: n, text: t }
            })
            .collect();
        let count = fields.len().max(1) as f64;
        let avg_name = (fields.iter().map(|d| d.name.len() as f64).sum::<f64>() / count).max(1.0);
        let avg_text = (fields.iter().map(|d| d.text.len() as f64).sum::<f64>() / count).max(1.0);

        // (document, tf~) per term id, documents in order.
        let mut per_term: Vec<Vec<(u32, f64)>> = vec![Vec::new(); spelled.len()];
        let mut merged: Vec<(u32, u32, u32)> = Vec::new();
        for (doc, mut d) in fields.into_iter().enumerate() {
            let name_norm = 1.0 - NAME_B + NAME_B * d.name.len() as f64 / avg_name;
            let text_norm = 1.0 - TEXT_B + TEXT_B * d.text.len() as f64 / avg_text;
            d.name.sort_unstable();
            d.text.sort_unstable();
            merged.clear();
            merged.extend(runs(&d.name).map(|(id, n)| (id, n, 0)));
            merged.extend(runs(&d.text).map(|(id, n)| (id, 0, n)));
            merged.sort_unstable();
            for group in merged.chunk_by(|a, b| a.0 == b.0) {
                let in_name: u32 = group.iter().map(|g| g.1).sum();
                let in_text: u32 = group.iter().map(|g| g.2).sum();
                let tf = NAME_WEIGHT * f64::from(in_name) / name_norm
                    + TEXT_WEIGHT * f64::from(in_text) / text_norm;
                per_term[group[0].0 as usize].push((doc as u32, tf));
            }
        }

        let mut order: Vec<u32> = (0..spelled.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| spelled[a as usize].cmp(&spelled[b as usize]));
        let mut terms: Vec<Box<str>> = Vec::with_capacity(order.len());
        let mut offsets = Vec::with_capacity(order.len() + 1);
        offsets.push(0);
        let mut postings = Vec::with_capacity(per_term.iter().map(Vec::len).sum());
        let total = documents.len() as f64;
        for id in order {
            let entries = &per_term[id as usize];
            let df = entries.len() as f64;
            let idf = (1.0 + (total - df + 0.5) / (df + 0.5)).ln();
            terms.push(std::mem::take(&mut spelled[id as usize]));
            postings.extend(entries.iter().map(|&(doc, tf)| (doc, idf * tf / (K1 + tf))));
            offsets.push(postings.len());
        }
        Ok(ToolIndex {
            names: documents
                .iter()
                .map(|(name, _)| name.as_ref().to_owned())
                .collect(),
            terms,
            offsets,
            postings,
        })
    }

    /// How many documents the index holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The documents' names, in the order given.
    #[must_use]
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// How many distinct terms the index holds.
    #[must_use]
    pub fn term_count(&self) -> usize {
        self.terms.len()
    }

    fn postings_of(&self, term: usize) -> &[(u32, f64)] {
        &self.postings[self.offsets[term]..self.offsets[term + 1]]
    }

    /// The indexed terms `term` is a proper prefix of, at most [`MAX_PREFIX_EXPANSIONS`].
    fn expansions(&self, term: &str) -> std::ops::Range<usize> {
        if term.chars().count() < MIN_PREFIX_CHARS {
            return 0..0;
        }
        // The first indexed term greater than `term` starts the range of its extensions.
        let start = self.terms.partition_point(|t| &**t <= term);
        let end = start
            + self.terms[start..]
                .iter()
                .take(MAX_PREFIX_EXPANSIONS)
                .take_while(|t| t.starts_with(term))
                .count();
        start..end
    }

    /// The `limit` best-scoring `(document index, score)` pairs for `query`,
    /// highest score first, ties by name; documents that match nothing are left out.
    ///
    /// # Errors
    ///
    /// [`RetrievalError::QueryTooLong`] for a query over [`MAX_QUERY_BYTES`].
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<(usize, f64)>, RetrievalError> {
        if query.len() > MAX_QUERY_BYTES {
            return Err(RetrievalError::QueryTooLong(query.len()));
        }
        if limit == 0 || self.names.is_empty() {
            return Ok(Vec::new());
        }
        let mut query_terms = tokenize(query);
        query_terms.sort_unstable();
        query_terms.dedup();

        let mut scores = vec![0.0f64; self.names.len()];
        let mut touched: Vec<u32> = Vec::new();
        // One query term's best weight per document, when it matches several indexed terms.
        let mut best: Vec<f64> = Vec::new();
        let mut best_touched: Vec<u32> = Vec::new();
        for term in &query_terms {
            let exact = self.terms.binary_search_by(|t| (**t).cmp(term)).ok();
            let prefixed = self.expansions(term);
            if prefixed.is_empty() {
                if let Some(i) = exact {
                    for &(doc, w) in self.postings_of(i) {
                        let slot = &mut scores[doc as usize];
                        if *slot == 0.0 {
                            touched.push(doc);
                        }
                        *slot += w;
                    }
                }
                continue;
            }
            if best.is_empty() {
                best.resize(self.names.len(), 0.0);
            }
            let matches = exact
                .map(|i| (i, 1.0))
                .into_iter()
                .chain(prefixed.map(|i| (i, PREFIX_WEIGHT)));
            for (i, factor) in matches {
                for &(doc, w) in self.postings_of(i) {
                    let slot = &mut best[doc as usize];
                    if *slot == 0.0 {
                        best_touched.push(doc);
                    }
                    *slot = slot.max(w * factor);
                }
            }
            for doc in best_touched.drain(..) {
                let d = doc as usize;
                if scores[d] == 0.0 {
                    touched.push(doc);
                }
                scores[d] += best[d];
                best[d] = 0.0;
            }
        }

        let mut hits: Vec<(usize, f64)> = touched
            .into_iter()
            .map(|doc| (doc as usize, scores[doc as usize]))
            .collect();
        let order = |a: &(usize, f64), b: &(usize, f64)| {
            b.1.total_cmp(&a.1)
                .then_with(|| self.names[a.0].cmp(&self.names[b.0]))
        };
        if hits.len() > limit {
            hits.select_nth_unstable_by(limit - 1, order);
            hits.truncate(limit);
        }
        hits.sort_unstable_by(order);
        Ok(hits)
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // equal scores are exactly equal: the same sums in the same order
mod tests;
