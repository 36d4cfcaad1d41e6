//! Routing, pure: which model a request is for. OpenAI-compatible
//! endpoints are routed by the JSON body's `model` field (or the model
//! header, which wins), KServe v2 inference by the path.

use http::Method;
use serde::Deserialize;

use crate::affinity::Prompt;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /v1/models`.
    ListModels,
    /// A served model name.
    Model(String),
}

/// Why a request has no route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Not an endpoint the gateway serves.
    #[error(
        "no such endpoint; the gateway serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models and /v2/models/{{name}}/infer"
    )]
    NotFound,
    /// A known path with the wrong method.
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    /// The body is not a JSON object.
    #[error("the request body is not valid JSON: {0}")]
    BadBody(String),
    /// Neither the body nor the header names a model.
    #[error("the request names no model (set the body's `model` field)")]
    NoModel,
}

#[derive(Deserialize)]
struct ModelField<'a> {
    // Borrowed from the body unless the JSON string has escapes.
    #[serde(default, borrow)]
    model: Option<std::borrow::Cow<'a, str>>,
    // The prompt, kept as raw JSON for prefix affinity (validated, not
    // parsed further here).
    #[serde(default, borrow)]
    messages: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    prompt: Option<&'a serde_json::value::RawValue>,
}

/// The last top-level `model` string of a JSON object, as a model server
/// reads it (Python's `json` keeps the last of duplicate keys); every
/// other value is checked and skipped, never built (a body of two
/// million small values must not become two million `Value`s).
struct LastModel(Option<String>);

impl<'de> Deserialize<'de> for LastModel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, Visitor};
        /// Whether a key is `model` (read without keeping it).
        struct IsModel(bool);
        impl<'de> Deserialize<'de> for IsModel {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = IsModel;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a key")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IsModel, E> {
                        Ok(IsModel(v == "model"))
                    }
                }
                d.deserialize_str(V)
            }
        }
        /// A `model` value: a string, or anything else skipped.
        struct Named(Option<String>);
        impl<'de> Deserialize<'de> for Named {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Named;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a JSON value")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Named, E> {
                        Ok(Named(Some(v.to_string())))
                    }
                    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Named, E> {
                        Ok(Named(None))
                    }
                    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Named, E> {
                        Ok(Named(None))
                    }
                    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Named, E> {
                        Ok(Named(None))
                    }
                    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Named, E> {
                        Ok(Named(None))
                    }
                    fn visit_unit<E: serde::de::Error>(self) -> Result<Named, E> {
                        Ok(Named(None))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Named, A::Error> {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        Ok(Named(None))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named, A::Error> {
                        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                        Ok(Named(None))
                    }
                }
                d.deserialize_any(V)
            }
        }
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = LastModel;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LastModel, A::Error> {
                let mut last = None;
                while let Some(IsModel(model)) = map.next_key()? {
                    if model {
                        last = map.next_value::<Named>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(LastModel(last))
            }
        }
        d.deserialize_map(Object)
    }
}

/// A route and the request's prompt fields.
#[derive(Debug, Clone)]
pub struct Routed<'a> {
    /// Where it goes.
    pub route: Route,
    /// Its prompt (empty for KServe and embeddings).
    pub prompt: Prompt<'a>,
    /// The model the body or the path names, where the model header
    /// named another: the caller refuses the request when both are
    /// models it serves (the header would move the request into another
    /// model's queue, priority and concurrency while the replica runs the
    /// one the request names), and routes by the header otherwise (a name
    /// only the model server knows).
    pub named: Option<String>,
}

/// Routes a request. `header_model` is the model header's value, if any;
/// `body` the whole request body (already size-limited); `known` tells
/// whether a served model has that name (KServe paths are matched against
/// the model list, since names may hold `/`).
pub fn route(
    method: &Method,
    path: &str,
    header_model: Option<&str>,
    body: &[u8],
    known: impl Fn(&str) -> bool,
) -> Result<Route, RouteError> {
    route_request(method, path, header_model, body, known).map(|r| r.route)
}

/// The methods a path takes, for the `Allow` field of a 405 (RFC 9110
/// §15.5.6).
pub fn allowed_methods(path: &str) -> &'static str {
    if path == "/v1/models" {
        "GET, HEAD"
    } else {
        "POST"
    }
}

/// [`route`], with the prompt fields of the body.
pub fn route_request<'a>(
    method: &Method,
    path: &str,
    header_model: Option<&str>,
    body: &'a [u8],
    known: impl Fn(&str) -> bool,
) -> Result<Routed<'a>, RouteError> {
    let plain = |route| Routed {
        route,
        prompt: Prompt::default(),
        named: None,
    };
    match path {
        "/v1/models" => {
            // RFC 9110 §9.1: a general-purpose server supports HEAD
            // wherever it supports GET.
            if method == Method::GET || method == Method::HEAD {
                Ok(plain(Route::ListModels))
            } else {
                Err(RouteError::MethodNotAllowed)
            }
        }
        "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => {
            if method != Method::POST {
                return Err(RouteError::MethodNotAllowed);
            }
            let header = header_model.map(str::trim).filter(|m| !m.is_empty());
            // Read as the model server reads it: Python's `json.loads` on
            // bytes skips a UTF-8 byte-order mark, and reads UTF-16 and
            // UTF-32 too (a NUL among the first bytes, or their marks).
            // Those are refused, not routed by the header unread: a body
            // the gateway cannot read may name another model than the
            // header (its queue, priority and concurrency for another
            // model's request).
            let json = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
            if json.iter().take(4).any(|&b| b == 0) || matches!(json.first(), Some(0xFE | 0xFF)) {
                return Err(RouteError::BadBody(
                    "expected UTF-8 (a UTF-16 or UTF-32 body)".into(),
                ));
            }
            // A JSON array (or anything but an object) names no model,
            // even though serde would read a struct from a sequence.
            if json.trim_ascii_start().first() != Some(&b'{') {
                return match header {
                    // The header names the model; the body is the model
                    // server's business.
                    Some(m) => Ok(plain(Route::Model(m.to_string()))),
                    None => Err(RouteError::BadBody("expected a JSON object".into())),
                };
            }
            let field: ModelField = match serde_json::from_slice(json) {
                Ok(f) => f,
                Err(e) => {
                    let Some(m) = header else {
                        return Err(RouteError::BadBody(e.to_string()));
                    };
                    // A body this reader does not type (a duplicate key, a
                    // `model` that is not a string): the header names the
                    // model. The body must still be JSON, and a model it
                    // names is compared with the header's as below — the
                    // last of duplicate keys, as Python's `json` keeps it
                    // ([`LastModel`]: nothing else of the body is built).
                    let LastModel(last) = serde_json::from_slice(json)
                        .map_err(|e| RouteError::BadBody(e.to_string()))?;
                    let named = last.filter(|b| !b.is_empty() && b != m);
                    return Ok(Routed {
                        named,
                        ..plain(Route::Model(m.to_string()))
                    });
                }
            };
            let prompt = if path == "/v1/embeddings" {
                Prompt::default()
            } else {
                Prompt {
                    messages: field.messages,
                    prompt: field.prompt,
                }
            };
            let (model, named) = match (header, field.model) {
                (Some(m), Some(b)) if !b.is_empty() && b != m => {
                    (m.to_string(), Some(b.into_owned()))
                }
                (Some(m), _) => (m.to_string(), None),
                (None, Some(m)) if !m.is_empty() => (m.into_owned(), None),
                _ => return Err(RouteError::NoModel),
            };
            Ok(Routed {
                route: Route::Model(model),
                prompt,
                named,
            })
        }
        _ => {
            let rest = path
                .strip_prefix("/v2/models/")
                .ok_or(RouteError::NotFound)?;
            let name = kserve_model(rest, &known).ok_or(RouteError::NotFound)?;
            if method != Method::POST {
                return Err(RouteError::MethodNotAllowed);
            }
            match header_model.map(str::trim).filter(|m| !m.is_empty()) {
                Some(m) if m != name => Ok(Routed {
                    named: Some(name),
                    ..plain(Route::Model(m.to_string()))
                }),
                _ => Ok(plain(Route::Model(name))),
            }
        }
    }
}

/// The model of a KServe v2 inference path after `/v2/models/`:
/// `{name}/infer` or `{name}/versions/{v}/infer`, percent-decoded (so
/// `meta-llama%2FLlama-3.1-8B-Instruct` is a name with `/`). Names hold
/// `/` (Hugging Face style), so the candidates are tried against the
/// served models, longest first; with none served, the plain reading
/// (`{name}` without `versions/…`) is returned for the caller's 404.
pub fn kserve_model(rest: &str, known: impl Fn(&str) -> bool) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .ok()?;
    // The raw target goes to the model server as it came: a dot segment,
    // a fragment, a backslash or an encoded query, raw or encoded, could
    // make the server read another path than the one routed here (a
    // normalising server would take `x/../../../v1/load_lora_adapter#/infer`
    // for its adapter-loading endpoint). No model name holds one.
    let odd =
        |p: &str| p.contains(['#', '\\', '?']) || p.split('/').any(|seg| seg == "." || seg == "..");
    if odd(rest) || odd(&decoded) {
        return None;
    }
    let before_infer = decoded.strip_suffix("/infer")?;
    if before_infer.is_empty() {
        return None;
    }
    // `{name}/versions/{v}`: the name is everything before the last
    // `/versions/` whose version segment holds no `/`.
    let versioned = before_infer
        .rsplit_once("/versions/")
        .filter(|(name, v)| !name.is_empty() && !v.is_empty() && !v.contains('/'))
        .map(|(name, _)| name);
    // Longest first: the whole path names a model whose name itself ends
    // in `/versions/x` before that reading is taken.
    let candidates = [Some(before_infer), versioned];
    if let Some(found) = candidates.iter().flatten().find(|c| known(c)) {
        return Some((*found).to_string());
    }
    Some(versioned.unwrap_or(before_infer).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kserve_path_the_server_could_read_otherwise_is_not_routed() {
        let post = |path: &str| {
            route(
                &Method::POST,
                path,
                Some("mistralai/Mistral-7B-v0.1"),
                b"{}",
                |_| true,
            )
        };
        for bad in [
            "/v2/models/x/../../../v1/load_lora_adapter#/infer",
            "/v2/models/x/..%2F..%2Fv1%2Fload_lora_adapter/infer",
            "/v2/models/x%2F..%2F..%2Fadmin/infer",
            "/v2/models/./infer",
            "/v2/models/x\\..\\y/infer",
            "/v2/models/x%3Fa=b/infer",
            "/v2/models/x%23/infer",
        ] {
            assert_eq!(post(bad), Err(RouteError::NotFound), "{bad}");
        }
        for good in [
            "/v2/models/x/infer",
            "/v2/models/meta-llama%2FLlama-3.1-8B-Instruct/infer",
            "/v2/models/meta-llama/Llama-3.1-8B-Instruct/versions/2/infer",
            "/v2/models/a.b..c/infer",
        ] {
            assert!(post(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn routes_by_body_header_and_path() {
        let body = br#"{"model": "llama", "messages": []}"#;
        assert_eq!(
            route(&Method::POST, "/v1/chat/completions", None, body, |_| true),
            Ok(Route::Model("llama".into()))
        );
        assert_eq!(
            route(
                &Method::POST,
                "/v1/chat/completions",
                Some("qwen"),
                body,
                |_| true
            ),
            Ok(Route::Model("qwen".into())),
            "the header wins"
        );
        assert_eq!(
            route(&Method::POST, "/v2/models/resnet/infer", None, b"", |m| m
                == "resnet"),
            Ok(Route::Model("resnet".into()))
        );
        assert_eq!(
            route(
                &Method::POST,
                "/v2/models/resnet/versions/3/infer",
                None,
                b"",
                |m| m == "resnet"
            ),
            Ok(Route::Model("resnet".into()))
        );
        assert_eq!(
            route(&Method::GET, "/v1/models", None, b"", |_| true),
            Ok(Route::ListModels)
        );
    }

    #[test]
    fn a_body_this_reader_cannot_type_still_names_its_model_beside_the_header() {
        let chat = |body: &[u8]| {
            route_request(
                &Method::POST,
                "/v1/chat/completions",
                Some("llama"),
                body,
                |_| true,
            )
            .map(|r| (r.route, r.named))
        };
        // Duplicate keys: the model server (Python's `json`) reads the
        // last, and so does the comparison with the header.
        assert_eq!(
            chat(br#"{"model":"qwen","model":"qwen","messages":[]}"#),
            Ok((Route::Model("llama".into()), Some("qwen".into())))
        );
        assert_eq!(
            chat(br#"{"model":"qwen","model":"llama","messages":[]}"#),
            Ok((Route::Model("llama".into()), None))
        );
        // Not JSON (`NaN` only Python reads): refused.
        assert!(matches!(
            chat(br#"{"model":"qwen","temperature":NaN}"#),
            Err(RouteError::BadBody(_))
        ));
        // A model that is not a string names none; the last string one
        // counts, whatever comes between.
        assert_eq!(
            chat(br#"{"model":1,"a":[0,{"model":"x"}],"model":"qwen"}"#),
            Ok((Route::Model("llama".into()), Some("qwen".into())))
        );
        assert_eq!(
            chat(br#"{"model":"qwen","model":[1,2]}"#),
            Ok((Route::Model("llama".into()), None))
        );
        // A UTF-8 byte-order mark is read past, as Python's `json` does;
        // UTF-16 and UTF-32 bodies are refused, not routed unread.
        assert_eq!(
            chat(b"\xEF\xBB\xBF{\"model\":\"qwen\",\"model\":\"qwen\"}"),
            Ok((Route::Model("llama".into()), Some("qwen".into())))
        );
        for utf16 in [
            &b"\x00{\x00\"\x00m"[..],
            b"{\x00\"\x00m\x00",
            b"\xFE\xFF\x00{",
            b"\xFF\xFE{\x00",
        ] {
            assert!(
                matches!(chat(utf16), Err(RouteError::BadBody(_))),
                "{utf16:?}"
            );
        }
        // A field of a shape the reader does not type, naming no other
        // model: the header routes it.
        assert_eq!(
            chat(br#"{"messages":{"odd":1},"model":"llama"}"#),
            Ok((Route::Model("llama".into()), None))
        );
    }

    #[test]
    fn bad_requests_say_why() {
        assert_eq!(
            route(
                &Method::POST,
                "/v1/embeddings",
                None,
                br#"{"input": "x"}"#,
                |_| true
            ),
            Err(RouteError::NoModel)
        );
        assert!(matches!(
            route(&Method::POST, "/v1/completions", None, b"{not json", |_| {
                true
            }),
            Err(RouteError::BadBody(_))
        ));
        assert_eq!(
            route(&Method::GET, "/v1/chat/completions", None, b"", |_| true),
            Err(RouteError::MethodNotAllowed)
        );
        assert_eq!(
            route(&Method::POST, "/v2/models/x/metadata", None, b"", |_| true),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route(&Method::GET, "/", None, b"", |_| true),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn a_json_array_names_no_model() {
        assert!(matches!(
            route(
                &Method::POST,
                "/v1/chat/completions",
                None,
                br#"["llama"]"#,
                |_| true
            ),
            Err(RouteError::BadBody(_))
        ));
        assert!(matches!(
            route(
                &Method::POST,
                "/v1/completions",
                None,
                br#" "llama" "#,
                |_| true
            ),
            Err(RouteError::BadBody(_))
        ));
        assert_eq!(
            route(
                &Method::POST,
                "/v1/completions",
                None,
                b" \n{\"model\":\"m\"}",
                |_| true
            ),
            Ok(Route::Model("m".into()))
        );
    }

    #[test]
    fn kserve_names_with_slashes_match_the_model_list_longest_first() {
        let models = [
            "meta-llama/Llama-3.1-8B-Instruct",
            "a",
            "a/b",
            "v/versions/2",
        ];
        let known = |m: &str| models.contains(&m);
        let k = |rest: &str| kserve_model(rest, known);
        assert_eq!(
            k("meta-llama/Llama-3.1-8B-Instruct/infer").as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(
            k("meta-llama%2FLlama-3.1-8B-Instruct/infer").as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(
            k("meta-llama/Llama-3.1-8B-Instruct/versions/7/infer").as_deref(),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(k("a/b/infer").as_deref(), Some("a/b"));
        assert_eq!(k("a/infer").as_deref(), Some("a"));
        assert_eq!(k("a/versions/1/infer").as_deref(), Some("a"));
        // A model whose own name reads like a version path.
        assert_eq!(k("v/versions/2/infer").as_deref(), Some("v/versions/2"));
        // Unknown names come back for the caller's 404.
        assert_eq!(k("nope/x/infer").as_deref(), Some("nope/x"));
        assert_eq!(k("infer"), None);
        assert_eq!(k("/infer"), None);
        assert_eq!(k("x/metadata"), None);
        assert_eq!(k("%FF/infer"), None, "not UTF-8");
        assert_eq!(
            route(
                &Method::POST,
                "/v2/models/meta-llama/Llama-3.1-8B-Instruct/infer",
                None,
                b"",
                known
            ),
            Ok(Route::Model("meta-llama/Llama-3.1-8B-Instruct".into()))
        );
    }
}
