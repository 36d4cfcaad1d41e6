//! Fuzzing the admin API over real sockets: random bodies and endpoints,
//! with and without the token, never register anything that the rules
//! forbid. The oracle reads each listed replica on its own terms (an
//! `http://` URL with a loopback IP literal, a port, a concurrency of at
//! least one, no more replicas than the cap), not through the gateway's
//! checking code.

mod common;

use std::net::IpAddr;

use common::*;
use http::StatusCode;
use proptest::prelude::*;

const CAP: usize = 5;

fn endpoint() -> impl Strategy<Value = String> {
    let scheme = prop_oneof![
        Just("http://"),
        Just("https://"),
        Just("HTTP://"),
        Just(""),
        Just("ftp://"),
        Just("http:/"),
    ];
    let userinfo = prop_oneof![4 => Just(""), 1 => Just("user:pw@"), 1 => Just("@")];
    let host = prop_oneof![
        Just("127.0.0.1".to_string()),
        Just("127.9.8.7".to_string()),
        Just("[::1]".to_string()),
        Just("169.254.169.254".to_string()),
        Just("[fe80::1]".to_string()),
        Just("[::ffff:169.254.169.254]".to_string()),
        Just("0.0.0.0".to_string()),
        Just("10.0.0.1".to_string()),
        Just("localhost".to_string()),
        Just("224.0.0.1".to_string()),
        "[a-z0-9.:%\\[\\]]{0,12}",
    ];
    let port = prop_oneof![
        Just(":8000".to_string()),
        Just(":0".to_string()),
        Just("".to_string()),
        Just(":65536".to_string()),
        (1u32..70000).prop_map(|p| format!(":{p}")),
    ];
    let tail = prop_oneof![
        4 => Just(""),
        1 => Just("/"),
        1 => Just("/v1"),
        1 => Just("?a=b"),
        1 => Just("#x"),
    ];
    prop_oneof![
        8 => (scheme, userinfo, host, port, tail)
            .prop_map(|(s, u, h, p, t)| format!("{s}{u}{h}{p}{t}")),
        1 => ".{0,40}",
    ]
}

fn body() -> impl Strategy<Value = String> {
    let concurrency = prop_oneof![
        Just(serde_json::Value::Null),
        Just(0.into()),
        Just(1.into()),
        Just(u32::MAX.into()),
        Just((-1).into()),
        Just("8".into()),
        (0u32..100).prop_map(Into::into),
    ];
    let model = prop_oneof![Just("m"), Just("other"), Just(""), Just("m ")];
    prop_oneof![
        6 => (model, endpoint(), concurrency).prop_map(|(m, e, c)| {
            let mut v = serde_json::json!({"model": m, "endpoint": e});
            if !c.is_null() {
                v["maxConcurrency"] = c;
            }
            v.to_string()
        }),
        1 => ".{0,80}",
        1 => endpoint().prop_map(|e| serde_json::json!([e]).to_string()),
        1 => endpoint().prop_map(|e| format!("{{\"model\":\"m\",\"endpoint\":\"{e}\",\"extra\":1}}")),
    ]
}

/// The oracle: what a replica registered over the API may look like.
fn acceptable(endpoint: &str, limit: u64) -> Result<(), String> {
    let rest = endpoint.strip_prefix("http://").ok_or("not http://")?;
    let (host, port) = rest.rsplit_once(':').ok_or("no port")?;
    let port: u16 = port.parse().map_err(|_| "bad port")?;
    if port == 0 {
        return Err("port 0".into());
    }
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("host {host} is not an IP literal"))?;
    // The test gateway allows loopback only.
    if !ip.is_loopback() {
        return Err(format!("{ip} is not loopback"));
    }
    if limit == 0 {
        return Err("maxConcurrency 0".into());
    }
    Ok(())
}

#[test]
fn random_registrations_never_register_anything_invalid() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut sp = spec(vec![model("m", &[], 4), model("other", &[], 4)]);
    sp.registration.max_replicas_per_model = CAP;
    let gw = rt.block_on(gateway(sp));
    let admin = gw.admin;
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(300);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
    runner
        .run(
            &(
                body(),
                any::<bool>(),
                prop_oneof![Just("POST"), Just("DELETE")],
            ),
            |(body, with_token, method)| {
                let headers: &[(&str, &str)] = if with_token { &[AUTH] } else { &[] };
                let r = rt.block_on(send(admin, method, "/v1/replicas", headers, body.clone()));
                prop_assert!(!r.status.is_server_error(), "{method} {body}: {}", r.status);
                if !with_token {
                    prop_assert_eq!(r.status, StatusCode::UNAUTHORIZED);
                }
                let list = rt
                    .block_on(send(admin, "GET", "/v1/replicas", &[], bytes::Bytes::new()))
                    .json();
                for (model, replicas) in list.as_object().unwrap() {
                    let replicas = replicas.as_array().unwrap();
                    prop_assert!(
                        replicas.len() <= CAP,
                        "{model}: {} replicas",
                        replicas.len()
                    );
                    for rep in replicas {
                        let e = rep["endpoint"].as_str().unwrap();
                        let limit = rep["max_concurrency"].as_u64().unwrap();
                        if let Err(why) = acceptable(e, limit) {
                            prop_assert!(false, "{body} left {e} registered: {why}");
                        }
                    }
                }
                Ok(())
            },
        )
        .unwrap();
    rt.block_on(gw.shutdown());
}
