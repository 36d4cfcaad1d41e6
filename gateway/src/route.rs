//! Routing, pure: which model a request is for. OpenAI-compatible
//! endpoints are routed by the JSON body's `model` field (or the model
//! header, which wins), KServe v2 inference by the path.

use http::Method;
use serde::Deserialize;

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
}

/// Routes a request. `header_model` is the model header's value, if any;
/// `body` the whole request body (already size-limited).
pub fn route(
    method: &Method,
    path: &str,
    header_model: Option<&str>,
    body: &[u8],
) -> Result<Route, RouteError> {
    match path {
        "/v1/models" => {
            if method == Method::GET {
                Ok(Route::ListModels)
            } else {
                Err(RouteError::MethodNotAllowed)
            }
        }
        "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings" => {
            if method != Method::POST {
                return Err(RouteError::MethodNotAllowed);
            }
            if let Some(m) = header_model.map(str::trim).filter(|m| !m.is_empty()) {
                return Ok(Route::Model(m.to_string()));
            }
            let field: ModelField =
                serde_json::from_slice(body).map_err(|e| RouteError::BadBody(e.to_string()))?;
            match field.model {
                Some(m) if !m.is_empty() => Ok(Route::Model(m.into_owned())),
                _ => Err(RouteError::NoModel),
            }
        }
        _ => {
            // /v2/models/{name}[/versions/{v}]/infer
            let rest = path
                .strip_prefix("/v2/models/")
                .ok_or(RouteError::NotFound)?;
            let mut segs = rest.split('/');
            let name = segs
                .next()
                .filter(|n| !n.is_empty())
                .ok_or(RouteError::NotFound)?;
            let tail: Vec<&str> = segs.collect();
            let ok = matches!(tail.as_slice(), ["infer"] | ["versions", _, "infer"]);
            if !ok {
                return Err(RouteError::NotFound);
            }
            if method != Method::POST {
                return Err(RouteError::MethodNotAllowed);
            }
            Ok(Route::Model(
                header_model
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .unwrap_or(name)
                    .to_string(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_body_header_and_path() {
        let body = br#"{"model": "llama", "messages": []}"#;
        assert_eq!(
            route(&Method::POST, "/v1/chat/completions", None, body),
            Ok(Route::Model("llama".into()))
        );
        assert_eq!(
            route(&Method::POST, "/v1/chat/completions", Some("qwen"), body),
            Ok(Route::Model("qwen".into())),
            "the header wins"
        );
        assert_eq!(
            route(&Method::POST, "/v2/models/resnet/infer", None, b""),
            Ok(Route::Model("resnet".into()))
        );
        assert_eq!(
            route(
                &Method::POST,
                "/v2/models/resnet/versions/3/infer",
                None,
                b""
            ),
            Ok(Route::Model("resnet".into()))
        );
        assert_eq!(
            route(&Method::GET, "/v1/models", None, b""),
            Ok(Route::ListModels)
        );
    }

    #[test]
    fn bad_requests_say_why() {
        assert_eq!(
            route(&Method::POST, "/v1/embeddings", None, br#"{"input": "x"}"#),
            Err(RouteError::NoModel)
        );
        assert!(matches!(
            route(&Method::POST, "/v1/completions", None, b"{not json"),
            Err(RouteError::BadBody(_))
        ));
        assert_eq!(
            route(&Method::GET, "/v1/chat/completions", None, b""),
            Err(RouteError::MethodNotAllowed)
        );
        assert_eq!(
            route(&Method::POST, "/v2/models/x/metadata", None, b""),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route(&Method::GET, "/", None, b""),
            Err(RouteError::NotFound)
        );
    }
}
