//! Reading YAML and JSON text into located documents.
//!
//! One parser (yaml-rust2's event parser, which reads JSON too) builds, for
//! each document, a `serde_json::Value` and an index from every field path
//! (`spec.nodes[2].gpus[0].mode`) to its line and column. Typed
//! deserialisation then runs on the value through `serde_path_to_error`, and
//! every error — a syntax error, an unknown field, a wrong type, or a
//! validation problem found later — is reported at the position of its path.
//!
//! Plain scalars are typed by the YAML 1.2 core schema (`8` is an integer,
//! `8.5` a float, `true` a boolean, `~` null); quoted scalars are strings.
//! Anchors and aliases are expanded, bounded by [`MAX_NODES`] so a "billion
//! laughs" document is an error, not an out-of-memory.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Number, Value};
use yaml_rust2::Yaml;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Most value nodes one file may expand to (aliases included).
pub const MAX_NODES: usize = 1_000_000;
/// Deepest nesting of mappings and sequences accepted.
pub const MAX_DEPTH: usize = 128;

/// A 1-based line and column in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

impl Position {
    fn from_marker(m: &Marker) -> Position {
        Position {
            line: m.line().max(1),
            column: m.col() + 1,
        }
    }
}

/// One problem in an input file, located.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    /// The file.
    pub file: PathBuf,
    /// Where in it.
    pub position: Position,
    /// The field path (`spec.resources.memoryGiB`), empty for syntax errors.
    pub path: String,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: ",
            self.file.display(),
            self.position.line,
            self.position.column
        )?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// One parsed document of a file, with the position of every field.
#[derive(Debug, Clone)]
pub struct Document {
    /// The file it came from.
    pub file: PathBuf,
    /// The document's number in its file, from 0.
    pub index: usize,
    /// The document's content.
    pub value: Value,
    /// Where the document starts.
    pub start: Position,
    positions: HashMap<String, Position>,
}

impl Document {
    /// Position of a field path; falls back to the nearest enclosing field
    /// that exists, then to the document's start.
    pub fn position_of(&self, path: &str) -> Position {
        let mut p = path;
        loop {
            if let Some(pos) = self.positions.get(p) {
                return *pos;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return self.start,
            }
        }
    }

    /// A problem at a field path of this document.
    pub fn problem(&self, path: impl Into<String>, message: impl Into<String>) -> Problem {
        let path = path.into();
        Problem {
            file: self.file.clone(),
            position: self.position_of(&path),
            path,
            message: message.into(),
        }
    }

    /// `(field[i], path)` for each path of a list field (`spec.policies`),
    /// for [`Document::missing`].
    pub fn each<'a>(
        field: &'a str,
        paths: &'a [PathBuf],
    ) -> impl Iterator<Item = (String, &'a Path)> + 'a {
        paths
            .iter()
            .enumerate()
            .map(move |(i, p)| (format!("{field}[{i}]"), p.as_path()))
    }

    /// Problems for the files this document names that do not exist:
    /// each `(field, path)` with `path` already joined to this file's
    /// folder, located at the field that names it, so an error about a
    /// file one document refers to says where the reference is.
    pub fn missing<'a>(&self, named: impl IntoIterator<Item = (String, &'a Path)>) -> Vec<Problem> {
        let folder = self
            .file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        named
            .into_iter()
            .filter(|(_, path)| !path.exists())
            .map(|(field, path)| {
                // (An absolute path was not joined to the folder: no note.)
                let note = if path.starts_with(folder) {
                    format!(
                        " (paths here are relative to {}, this file's folder)",
                        folder.display()
                    )
                } else {
                    String::new()
                };
                self.problem(
                    field,
                    format!("{}: no such file or folder{note}", path.display()),
                )
            })
            .collect()
    }

    /// The top-level `kind` field, if it is a string.
    pub fn kind(&self) -> Option<&str> {
        self.value.get("kind").and_then(Value::as_str)
    }
}

enum Frame {
    Map {
        path: String,
        map: Map<String, Value>,
        /// The key read, waiting for its value.
        key: Option<String>,
    },
    Seq {
        path: String,
        items: Vec<Value>,
    },
}

struct Builder {
    file: PathBuf,
    docs: Vec<Document>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Value>,
    /// Anchors of the open containers, by stack depth.
    open_anchors: Vec<usize>,
    positions: HashMap<String, Position>,
    doc_start: Position,
    root: Option<Value>,
    nodes: usize,
    error: Option<Problem>,
}

fn node_count(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(node_count).sum::<usize>(),
        Value::Object(o) => 1 + o.values().map(node_count).sum::<usize>(),
        _ => 1,
    }
}

fn plain_scalar(s: &str) -> Value {
    match Yaml::from_str(s) {
        Yaml::Integer(i) => Value::Number(i.into()),
        Yaml::Real(r) => match r.parse::<f64>().ok().and_then(Number::from_f64) {
            Some(n) => Value::Number(n),
            // .inf, .nan: not numbers a policy can use; keep the text so the
            // typed layer reports a type error naming it.
            None => Value::String(s.to_string()),
        },
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Null => Value::Null,
        _ => Value::String(s.to_string()),
    }
}

/// A scalar as its tag says, YAML 1.2's core schema (what yaml-rust2's
/// own loader and Kubernetes' YAML read): `!!str 12` is the text `12`,
/// `!!int`, `!!float`, `!!bool` and `!!null` must hold what they name;
/// untagged plain scalars are resolved, quoted ones are text. Other tags
/// are refused rather than read as something they may not mean.
fn tagged_scalar(text: &str, style: TScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    let Some(tag) = tag else {
        return Ok(if style == TScalarStyle::Plain {
            plain_scalar(text)
        } else {
            Value::String(text.to_string())
        });
    };
    // The non-specific tag `!`: a string (YAML 1.2, 6.9.1).
    if non_specific(tag) {
        return Ok(Value::String(text.to_string()));
    }
    let Some(suffix) = core_tag(tag) else {
        return Err(format!(
            "the YAML tag `{}` is not one gpuscale reads (only the core schema's: !!str, !!int, !!float, !!bool, !!null)",
            tag_text(tag)
        ));
    };
    let resolved = plain_scalar(text);
    let ok = match suffix {
        "str" => return Ok(Value::String(text.to_string())),
        "int" => resolved.as_i64().is_some() || resolved.as_u64().is_some(),
        "float" => resolved.is_number(),
        "bool" => resolved.is_boolean(),
        "null" => resolved.is_null(),
        _ => {
            return Err(format!(
                "the YAML tag `!!{suffix}` is not one gpuscale reads (only !!str, !!int, !!float, !!bool, !!null)"
            ));
        }
    };
    if ok {
        Ok(resolved)
    } else {
        Err(format!(
            "`{}` is not what its tag `!!{suffix}` says",
            crate::model::shown(text),
        ))
    }
}

/// Whether a tag is the non-specific `!`.
fn non_specific(tag: &Tag) -> bool {
    format!("{}{}", tag.handle, tag.suffix) == "!"
}

/// A tag as written: `!!str` for the core schema's, else its text.
fn tag_text(tag: &Tag) -> String {
    match core_tag(tag) {
        Some(name) => format!("!!{name}"),
        None => format!("{}{}", tag.handle, tag.suffix),
    }
}

/// The core schema's name of a tag (`str` for `!!str` and for the
/// verbatim `!<tag:yaml.org,2002:str>`), if it is one.
fn core_tag(tag: &Tag) -> Option<&str> {
    const CORE: &str = "tag:yaml.org,2002:";
    if tag.handle == CORE {
        Some(tag.suffix.as_str())
    } else if tag.handle.is_empty() || tag.handle == "!" {
        tag.suffix.strip_prefix(CORE)
    } else {
        None
    }
}

fn key_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Builder {
    fn fail(&mut self, mark: &Marker, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(Problem {
                file: self.file.clone(),
                position: Position::from_marker(mark),
                path: String::new(),
                message: message.into(),
            });
        }
    }

    /// The path the next value will have, recording the position of the
    /// value (sequence items) or of its key (mapping entries, already done).
    fn child_path(&mut self, mark: &Marker) -> Option<String> {
        match self.stack.last() {
            None => Some(String::new()),
            Some(Frame::Map { path, key, .. }) => key.as_ref().map(|k| join(path, k)),
            Some(Frame::Seq { path, items }) => {
                let p = format!("{path}[{}]", items.len());
                self.positions
                    .insert(p.clone(), Position::from_marker(mark));
                Some(p)
            }
        }
    }

    /// Attaches a finished value to its parent (or makes it the root).
    fn attach(&mut self, value: Value, anchor: usize, mark: &Marker, added: usize) {
        self.nodes = self.nodes.saturating_add(added);
        if self.nodes > MAX_NODES {
            let why = if added > 1 {
                // An alias repeats its anchor's values: nested ones
                // multiply (a "billion laughs" document).
                format!(
                    "this alias takes the document past {MAX_NODES} values (each alias counts the values it repeats)"
                )
            } else {
                format!(
                    "the document holds more than {MAX_NODES} values: split it into several files, or write identical nodes as one template (`count`)"
                )
            };
            self.fail(mark, why);
            return;
        }
        if anchor > 0 {
            self.anchors.insert(anchor, value.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(value),
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { map, key, path }) => match key.take() {
                Some(k) => {
                    map.insert(k, value);
                }
                None => {
                    let k = key_text(&value);
                    if map.contains_key(&k) {
                        let p = join(path, &k);
                        self.fail(mark, format!("duplicate key `{p}`"));
                        return;
                    }
                    let p = join(path, &k);
                    self.positions.insert(p, Position::from_marker(mark));
                    if let Some(Frame::Map { key, .. }) = self.stack.last_mut() {
                        *key = Some(k);
                    }
                }
            },
        }
    }

    fn is_key_position(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Map { key: None, .. }))
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        match ev {
            Event::DocumentStart => {
                self.doc_start = Position::from_marker(&mark);
                self.positions.clear();
                self.anchors.clear();
                self.root = None;
            }
            Event::DocumentEnd => {
                let value = self.root.take().unwrap_or(Value::Null);
                let positions = std::mem::take(&mut self.positions);
                let index = self.docs.len();
                self.docs.push(Document {
                    file: self.file.clone(),
                    index,
                    value,
                    start: self.doc_start,
                    positions,
                });
            }
            Event::Scalar(text, style, anchor, tag) => {
                let key_position = self.is_key_position();
                if !key_position {
                    self.child_path(&mark);
                }
                let value = match tagged_scalar(&text, style, tag.as_ref()) {
                    Ok(v) => v,
                    Err(message) => {
                        self.fail(&mark, message);
                        return;
                    }
                };
                self.attach(value, anchor, &mark, 1);
            }
            Event::Alias(id) => {
                let key_position = self.is_key_position();
                if !key_position {
                    self.child_path(&mark);
                }
                match self.anchors.get(&id).cloned() {
                    Some(v) => {
                        let n = node_count(&v);
                        self.attach(v, 0, &mark, n)
                    }
                    None => self.fail(&mark, "alias to an unknown anchor"),
                }
            }
            Event::MappingStart(anchor, ref tag) | Event::SequenceStart(anchor, ref tag) => {
                // A collection's tag: its own kind (`!!map`, `!!seq`) or
                // none; `!!str [a, b]` is not text, so it is refused.
                let want = if matches!(ev, Event::MappingStart(..)) {
                    "map"
                } else {
                    "seq"
                };
                if let Some(t) = tag
                    && !non_specific(t)
                    && core_tag(t) != Some(want)
                {
                    self.fail(
                        &mark,
                        format!(
                            "the YAML tag `{}` does not fit a {}",
                            tag_text(t),
                            if want == "map" { "mapping" } else { "sequence" }
                        ),
                    );
                    return;
                }
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(&mark, format!("nesting deeper than {MAX_DEPTH} levels"));
                    return;
                }
                let path = if self.is_key_position() {
                    // A mapping or sequence used as a key: allowed by YAML,
                    // never by gpuscale's files; its text becomes the key.
                    "?".to_string()
                } else {
                    self.child_path(&mark).unwrap_or_default()
                };
                self.open_anchors.push(anchor);
                self.stack.push(if matches!(ev, Event::MappingStart(..)) {
                    Frame::Map {
                        path,
                        map: Map::new(),
                        key: None,
                    }
                } else {
                    Frame::Seq {
                        path,
                        items: Vec::new(),
                    }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let anchor = self.open_anchors.pop().unwrap_or(0);
                let value = match self.stack.pop() {
                    Some(Frame::Map { map, .. }) => Value::Object(map),
                    Some(Frame::Seq { items, .. }) => Value::Array(items),
                    None => return,
                };
                self.attach(value, anchor, &mark, 1);
            }
            Event::StreamStart | Event::StreamEnd | Event::Nothing => {}
        }
    }
}

/// Parses YAML text (one or more `---`-separated documents). Empty documents
/// (only comments, or nothing) are dropped.
pub fn parse_yaml(file: &Path, source: &str) -> Result<Vec<Document>, Problem> {
    let mut builder = Builder {
        file: file.to_path_buf(),
        docs: Vec::new(),
        stack: Vec::new(),
        anchors: HashMap::new(),
        open_anchors: Vec::new(),
        positions: HashMap::new(),
        doc_start: Position { line: 1, column: 1 },
        root: None,
        nodes: 0,
        error: None,
    };
    let mut parser = Parser::new_from_str(source);
    if let Err(e) = parser.load(&mut builder, true) {
        return Err(Problem {
            file: file.to_path_buf(),
            position: Position::from_marker(e.marker()),
            path: String::new(),
            message: format!("YAML syntax error: {}", e.info()),
        });
    }
    if let Some(problem) = builder.error {
        return Err(problem);
    }
    let mut docs: Vec<Document> = builder
        .docs
        .into_iter()
        .filter(|d| !d.value.is_null())
        .collect();
    for (i, d) in docs.iter_mut().enumerate() {
        d.index = i;
    }
    Ok(docs)
}

/// Parses a JSON file: strict JSON syntax (checked by serde_json), then
/// located like YAML (JSON is YAML's flow style).
pub fn parse_json(file: &Path, source: &str) -> Result<Vec<Document>, Problem> {
    if let Err(e) = serde_json::from_str::<Value>(source) {
        // serde_json's text ends with its own position, which the
        // problem's place already gives (its column counted from 1).
        let text = e.to_string();
        let message = text
            .rsplit_once(" at line ")
            .map_or(text.as_str(), |(m, _)| m)
            .to_string();
        return Err(Problem {
            file: file.to_path_buf(),
            position: Position {
                line: e.line().max(1),
                column: e.column().max(1),
            },
            path: String::new(),
            message: format!("JSON syntax error: {message}"),
        });
    }
    parse_yaml(file, source)
}

/// Parses by file extension: `.json` as JSON, anything else as YAML.
pub fn parse(file: &Path, source: &str) -> Result<Vec<Document>, Problem> {
    // A byte-order mark (Windows editors write one) starts the stream, as
    // YAML and JSON allow; left in, it became part of the first key and
    // the file was said to lack `apiVersion`.
    let source = source.strip_prefix('\u{feff}').unwrap_or(source);
    match file.extension().and_then(|e| e.to_str()) {
        Some("json") => parse_json(file, source),
        _ => parse_yaml(file, source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_order_mark_starts_the_stream_and_is_not_a_key() {
        for name in ["bom.yaml", "bom.json"] {
            let text = if name.ends_with("json") {
                "\u{feff}{\"apiVersion\": \"v\", \"kind\": \"K\"}"
            } else {
                "\u{feff}apiVersion: v\nkind: K\n"
            };
            let d = parse(Path::new(name), text).unwrap();
            assert_eq!(d.len(), 1);
            assert_eq!(d[0].kind(), Some("K"), "{name}");
        }
    }

    fn docs(src: &str) -> Vec<Document> {
        parse_yaml(Path::new("t.yaml"), src).unwrap()
    }

    #[test]
    fn positions_of_keys_and_items() {
        let d = &docs("a: 1\nb:\n  c: [x, y]\n  d:\n    - e: 2\n      f: 3\n")[0];
        assert_eq!(d.position_of("a"), Position { line: 1, column: 1 });
        assert_eq!(d.position_of("b.c"), Position { line: 3, column: 3 });
        assert_eq!(d.position_of("b.d[0].f"), Position { line: 6, column: 7 });
        // Unknown paths fall back to their nearest known parent.
        assert_eq!(d.position_of("b.d[0].zzz").line, 5);
        assert_eq!(
            d.value,
            serde_json::json!({"a": 1, "b": {"c": ["x", "y"], "d": [{"e": 2, "f": 3}]}})
        );
    }

    #[test]
    fn scalars_follow_the_core_schema() {
        let d = &docs("i: 8\nf: 8.5\nb: true\nn: ~\ns: '8'\nt: hello\n")[0];
        assert_eq!(
            d.value,
            serde_json::json!({"i": 8, "f": 8.5, "b": true, "n": null, "s": "8", "t": "hello"})
        );
    }

    #[test]
    fn multiple_documents_keep_their_own_positions() {
        let ds = docs("---\nkind: A\n---\n# only a comment\n---\nkind: B\nx: 1\n");
        assert_eq!(ds.len(), 2);
        assert_eq!(ds[1].kind(), Some("B"));
        assert_eq!(ds[1].position_of("x"), Position { line: 7, column: 1 });
    }

    #[test]
    fn errors_are_located() {
        let e = parse_yaml(Path::new("t.yaml"), "a: 1\nb: [1, 2\n").unwrap_err();
        assert!(e.message.contains("YAML syntax error"), "{e}");
        let e = parse_yaml(Path::new("t.yaml"), "a: 1\na: 2\n").unwrap_err();
        assert_eq!(e.position.line, 2);
        assert!(e.message.contains("duplicate key"), "{e}");
        let e = parse_json(Path::new("t.json"), "{\"a\": 1,\n \"b\": }").unwrap_err();
        assert_eq!(e.position.line, 2);
    }

    #[test]
    fn aliases_expand_and_bombs_are_refused() {
        let d = &docs("a: &x {k: 1}\nb: *x\n")[0];
        assert_eq!(d.value["b"]["k"], 1);
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let prev = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let e = parse_yaml(Path::new("t.yaml"), &bomb).unwrap_err();
        assert!(
            e.message.contains("this alias takes the document past"),
            "{e}"
        );
        // Plain values past the limit: no alias to blame.
        let flat = format!("v: [{}]\n", vec!["1"; MAX_NODES + 1].join(","));
        let e = parse_yaml(Path::new("flat.yaml"), &flat).unwrap_err();
        assert!(e.message.contains("split it into several files"), "{e}");
    }

    #[test]
    fn json_reads_with_positions() {
        let d = &parse_json(
            Path::new("t.json"),
            "{\n  \"kind\": \"X\",\n  \"spec\": {\"a\": 1}\n}",
        )
        .unwrap()[0];
        assert_eq!(d.kind(), Some("X"));
        assert_eq!(d.position_of("spec.a").line, 3);
    }
}
