//! BM25F (Okapi BM25 over weighted fields) on an inverted index.
//!
//! A document is a list of `(field, term)`. Each field has a weight and its own length
//! normalisation, so a term in a short name counts more than in a long one, and a name
//! counts more than a description (Robertson, Zaragoza & Taylor, "Simple BM25 extension
//! to multiple weighted fields", 2004):
//!
//! ```text
//! tf~(t, d)   = Σ_f weight_f · tf_f(t, d) / (1 − b_f + b_f · len_f(d) / avglen_f)
//! score(d, q) = Σ_{t ∈ q} idf(t) · tf~(t, d) · (k1 + 1) / (tf~(t, d) + k1)
//! idf(t)      = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5))
//! ```
//!
//! `tf~` is computed at build time ([`Builder`]), so a query only walks the postings of
//! its terms.

use std::collections::HashMap;

/// Term-frequency saturation.
pub const K1: f32 = 1.2;
/// Length normalisation, the usual default.
pub const B: f32 = 0.75;

/// A field of the documents: how much its terms count, how much its length matters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub weight: f32,
    pub b: f32,
}

#[derive(Debug, Clone, Copy)]
struct Posting {
    doc: u32,
    /// `tf~` of the term in the document.
    tf: f32,
}

/// The index: postings per term.
#[derive(Debug, Default)]
pub struct Bm25 {
    terms: HashMap<String, u32>,
    /// Postings by term id, in document order.
    postings: Vec<Vec<Posting>>,
    documents: usize,
}

/// Collects documents term by term; [`Builder::finish`] computes `tf~`.
pub struct Builder<'f> {
    fields: &'f [Field],
    terms: HashMap<String, u32>,
    /// `(term id, field)` of every occurrence, per document.
    occurrences: Vec<Vec<(u32, u8)>>,
    /// Terms per field, per document.
    lengths: Vec<Vec<u32>>,
}

impl<'f> Builder<'f> {
    /// # Panics
    ///
    /// With more than 256 fields.
    pub fn new(fields: &'f [Field]) -> Builder<'f> {
        assert!(fields.len() <= 256, "at most 256 fields");
        Builder {
            fields,
            terms: HashMap::new(),
            occurrences: Vec::new(),
            lengths: Vec::new(),
        }
    }

    /// Starts the next document (numbered from 0).
    pub fn document(&mut self) {
        self.occurrences.push(Vec::new());
        self.lengths.push(vec![0; self.fields.len()]);
    }

    /// Adds one occurrence of `term` in `field` to the current document.
    ///
    /// # Panics
    ///
    /// Before [`document`](Self::document), or if `field` is out of range.
    pub fn add(&mut self, field: usize, term: &str) {
        let length = self.lengths.last_mut().expect("a document was started");
        length[field] += 1;
        let id = match self.terms.get(term) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.terms.len()).expect("fewer than 2^32 terms");
                self.terms.insert(term.to_string(), id);
                id
            }
        };
        let occurrences = self.occurrences.last_mut().expect("a document was started");
        occurrences.push((id, field as u8));
    }

    pub fn finish(self) -> Bm25 {
        let documents = self.occurrences.len();
        let n = documents.max(1) as f32;
        let average: Vec<f32> = (0..self.fields.len())
            .map(|f| self.lengths.iter().map(|l| l[f] as f32).sum::<f32>() / n)
            .collect();
        let mut postings: Vec<Vec<Posting>> = vec![Vec::new(); self.terms.len()];
        let docs = self.occurrences.into_iter().zip(self.lengths);
        for (doc, (mut occurrences, length)) in docs.enumerate() {
            let doc = u32::try_from(doc).expect("fewer than 2^32 documents");
            // What one occurrence in each field adds to tf~ in this document.
            let unit: Vec<f32> = self
                .fields
                .iter()
                .zip(&length)
                .zip(&average)
                .map(|((field, &len), &avg)| {
                    let ratio = if avg > 0.0 { len as f32 / avg } else { 1.0 };
                    field.weight / (1.0 - field.b + field.b * ratio)
                })
                .collect();
            occurrences.sort_unstable();
            for group in occurrences.chunk_by(|a, b| a.0 == b.0) {
                let tf = group.iter().map(|&(_, f)| unit[f as usize]).sum();
                postings[group[0].0 as usize].push(Posting { doc, tf });
            }
        }
        Bm25 {
            terms: self.terms,
            postings,
            documents,
        }
    }
}

impl Bm25 {
    /// Indexes `docs`, numbered from 0 in order; each is a list of `(field, term)`, the
    /// field an index into `fields`.
    ///
    /// # Panics
    ///
    /// If a field index is out of range.
    pub fn build<I, D, T>(fields: &[Field], docs: I) -> Bm25
    where
        I: IntoIterator<Item = D>,
        D: IntoIterator<Item = (usize, T)>,
        T: AsRef<str>,
    {
        let mut builder = Builder::new(fields);
        for doc in docs {
            builder.document();
            for (field, term) in doc {
                builder.add(field, term.as_ref());
            }
        }
        builder.finish()
    }

    pub fn documents(&self) -> usize {
        self.documents
    }

    /// Inverse document frequency of a term found in `df` documents.
    fn idf(&self, df: usize) -> f32 {
        let n = self.documents as f32;
        let df = df as f32;
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// Every document that contains at least one of `terms`, with its score (> 0), in no
    /// particular order. Repeated query terms count once; unknown terms add nothing.
    pub fn matches(&self, terms: &[String]) -> Vec<(u32, f32)> {
        let mut ids: Vec<u32> = terms
            .iter()
            .filter_map(|t| self.terms.get(t))
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut scores = vec![0.0f32; self.documents];
        let mut touched = Vec::new();
        for id in ids {
            let postings = &self.postings[id as usize];
            let idf = self.idf(postings.len());
            for p in postings {
                let score = &mut scores[p.doc as usize];
                if *score == 0.0 {
                    touched.push(p.doc);
                }
                *score += idf * p.tf * (K1 + 1.0) / (p.tf + K1);
            }
        }
        touched
            .into_iter()
            .map(|doc| (doc, scores[doc as usize]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: usize = 0;
    const TEXT: usize = 1;
    const FIELDS: &[Field] = &[Field { weight: 3.0, b: B }, Field { weight: 1.0, b: B }];

    fn doc(terms: &[(usize, &str)]) -> Vec<(usize, String)> {
        terms.iter().map(|(f, t)| (*f, t.to_string())).collect()
    }

    fn q(terms: &[&str]) -> Vec<String> {
        terms.iter().map(|t| t.to_string()).collect()
    }

    fn ranked(index: &Bm25, terms: &[&str]) -> Vec<u32> {
        let mut m = index.matches(&q(terms));
        m.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        m.into_iter().map(|(d, _)| d).collect()
    }

    #[test]
    fn scores_follow_the_formula() {
        // Text lengths 2 and 4 (average 3), name lengths 1 and 0 (average 0.5).
        let index = Bm25::build(
            FIELDS,
            [
                doc(&[(NAME, "x"), (TEXT, "x"), (TEXT, "y")]),
                doc(&[(TEXT, "y"), (TEXT, "y"), (TEXT, "z"), (TEXT, "z")]),
            ],
        );
        let m = index.matches(&q(&["x"]));
        assert_eq!(m.len(), 1);
        let idf = (1.0f32 + (2.0 - 1.0 + 0.5) / (1.0 + 0.5)).ln();
        let tf = 3.0 / (1.0 - B + B * 1.0 / 0.5) + 1.0 / (1.0 - B + B * 2.0 / 3.0);
        let expected = idf * tf * (K1 + 1.0) / (tf + K1);
        assert_eq!(m[0].0, 0);
        assert!((m[0].1 - expected).abs() < 1e-6, "{} vs {expected}", m[0].1);
    }

    #[test]
    fn rare_terms_and_weighted_fields_rank_higher() {
        let index = Bm25::build(
            FIELDS,
            [
                doc(&[(TEXT, "read"), (TEXT, "file"), (TEXT, "common")]),
                doc(&[(NAME, "read"), (NAME, "file"), (TEXT, "common")]),
                doc(&[(NAME, "write"), (NAME, "file"), (TEXT, "common")]),
                doc(&[(TEXT, "common"), (TEXT, "rare")]),
            ],
        );
        assert_eq!(ranked(&index, &["read", "file"]), [1, 0, 2]);
        // "rare" is in one document, "common" in all four: rare wins.
        assert_eq!(ranked(&index, &["common", "rare"])[0], 3);
        assert!(index.matches(&q(&["missing"])).is_empty());
        assert!(index.matches(&[]).is_empty());
        // A repeated query term counts once.
        assert_eq!(
            index.matches(&q(&["rare"])),
            index.matches(&q(&["rare", "rare"]))
        );
    }

    #[test]
    fn a_term_in_a_shorter_field_counts_more() {
        // Same description; the first name is longer.
        let index = Bm25::build(
            FIELDS,
            [
                doc(&[(NAME, "list"), (NAME, "allowed"), (NAME, "directory")]),
                doc(&[(NAME, "list"), (NAME, "directory")]),
            ],
        );
        assert_eq!(ranked(&index, &["list", "directory"]), [1, 0]);
        // Field lengths are separate: a long text does not dilute the name.
        let index = Bm25::build(
            FIELDS,
            [
                doc(&[(NAME, "x"), (TEXT, "a"), (TEXT, "b"), (TEXT, "c")]),
                doc(&[(NAME, "x"), (NAME, "y")]),
            ],
        );
        assert_eq!(ranked(&index, &["x"]), [0, 1]);
    }

    #[test]
    fn empty_index() {
        let index = Bm25::build(FIELDS, Vec::<Vec<(usize, &str)>>::new());
        assert_eq!(index.documents(), 0);
        assert!(index.matches(&q(&["x"])).is_empty());
    }
}
