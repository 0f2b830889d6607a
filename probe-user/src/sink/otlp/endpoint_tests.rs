//! `--otlp-endpoint`'s parser with and without the `otlp` feature (`cargo test -p clb-probe
//! --no-default-features --lib sink::otlp` runs the second).

use super::{EndpointError, parse_endpoint};

#[test]
fn a_good_endpoint_is_taken_only_by_an_agent_that_can_export() {
    let parsed = parse_endpoint("http://otel-collector:4317");
    if cfg!(feature = "otlp") {
        assert_eq!(parsed, Ok("http://otel-collector:4317".to_string()));
    } else {
        let err = parsed.unwrap_err();
        assert_eq!(err, EndpointError::NotBuilt);
        assert!(
            err.to_string().contains("built without OTLP export"),
            "{err}"
        );
    }
}

#[test]
fn a_bad_endpoint_is_named_as_bad_with_or_without_the_feature() {
    assert_eq!(parse_endpoint("https://c:4317"), Err(EndpointError::Https));
}
