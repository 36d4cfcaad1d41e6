//! Independent, literal Rust transcription of the Kubernetes HorizontalPodAutoscaler
//! replica-count algorithm ("behavior" path + external per-pod metric), for use as a
//! test oracle. std only.
//!
//! SOURCES READ (via the code index; these are the only stored copies of the files)
//!
//!  [M] "master": pkg/controller/podautoscaler/{horizontal.go,replica_calculator.go} as
//!      found in adrianmoisey/kubernetes@786f7bb4cc6bb286764c4580f802a90be4f275a5 and
//!      omerap12/kubernetes@a769d5884497dc246960b38f3e5aae2cc30dd062 (both forks of
//!      kubernetes/kubernetes; the behavior functions are byte-identical in both; the
//!      code has autoscaling/v2, configurable Tolerances (KEP-4951, 1.33+), and the
//!      HPAScaleToZero "ScaledToZero" condition, i.e. current master, ~1.35/1.36).
//!      The index's copy of kubernetes/kubernetes itself is OLD (see [L]), so the
//!      current behavior had to be read from these forks.
//!  [L] "v1.21": kubernetes/kubernetes@00067268967ec95a40035bd666374a1caf48dd1a
//!      (autoscaling/v2beta2 imports, ~v1.20/1.21). Every function named in the
//!      brief exists there, but several differ from [M]; gpuscale follows [M],
//!      and the comments below say where [L] differed (its functions are not
//!      transcribed here).
//!      (The index's other kubernetes/kubernetes copy, bba5ea77..., is the 2015
//!      original controller and has none of these functions.)
//!  [D] pkg/apis/autoscaling/v2/defaults.go (API defaulting of behavior), read from a
//!      stored copy of that file (same content as upstream v2 defaults).
//!
//! TIME MODEL
//!   Go uses time.Time (integer nanoseconds). Here time is f64 seconds. Go's
//!   `t.Before(c)` is `t < c` and `t.After(c)` is `t > c` (both STRICT). Cutoffs are
//!   computed literally as `now - seconds`. Use exactly representable times
//!   (e.g. integers) if you want bit-exact boundary behaviour.
//!   Go calls time.Now() several times inside one reconcile (the stored timestamp is
//!   a few ns later than the cutoffs); the oracle uses the single `now` passed in.
//!
//! INTEGER MODEL
//!   Go int32 `+`/`-` wrap on overflow -> wrapping_add / wrapping_sub here.
//!   Go `int32(f)` truncates toward zero for in-range f -> `go_int32_from_f64`.

// A literal transcription keeps Go's shape (explicit loops, early returns,
// mutable temporaries) so it can be read against the source line by line;
// clippy's style advice would blur that.
#![allow(dead_code, clippy::all, clippy::doc_lazy_continuation)]

// ---------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    Pods,    // autoscalingv2.PodsScalingPolicy
    Percent, // autoscalingv2.PercentScalingPolicy
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalingPolicy {
    pub kind: PolicyKind,
    pub value: i32,
    /// Go: PeriodSeconds int32.
    pub period_secs: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    Max,      // MaxChangePolicySelect ("Max"), also the API default
    Min,      // MinChangePolicySelect ("Min")  ([L] calls it MinPolicySelect)
    Disabled, // DisabledPolicySelect ("Disabled")
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Go: *int32 StabilizationWindowSeconds (always non-nil by the time the
    /// controller uses it: API defaulting fills scaleUp=0, and
    /// maybeInitScaleDownStabilizationWindow fills scaleDown from the
    /// --horizontal-pod-autoscaler-downscale-stabilization flag, default 300s).
    pub stabilization_window_secs: f64,
    pub select: Select,
    pub policies: Vec<ScalingPolicy>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Behavior {
    pub up: Rules,
    pub down: Rules,
}

impl Behavior {
    /// Transcribes pkg/apis/autoscaling/v2/defaults.go:defaultHPAScaleUpRules /
    /// defaultHPAScaleDownRules plus horizontal.go:maybeInitScaleDownStabilizationWindow
    /// (downscale window from the controller flag; upstream default 300s).
    /// NOTE: these defaults are only applied upstream when spec.behavior != nil
    /// (SetDefaults_HorizontalPodAutoscalerBehavior); with behavior == nil the
    /// controller takes the separate normalizeDesiredReplicas path (not
    /// transcribed here: gpuscale always has a behaviour, HPA's defaults
    /// when the policy sets none).
    pub fn k8s_default(downscale_stabilisation_window_secs: f64) -> Behavior {
        Behavior {
            up: Rules {
                stabilization_window_secs: 0.0,
                select: Select::Max,
                policies: vec![
                    ScalingPolicy {
                        kind: PolicyKind::Pods,
                        value: 4,
                        period_secs: 15.0,
                    },
                    ScalingPolicy {
                        kind: PolicyKind::Percent,
                        value: 100,
                        period_secs: 15.0,
                    },
                ],
            },
            down: Rules {
                // (int32)(a.downscaleStabilisationWindow.Seconds()) -> truncation
                stabilization_window_secs: (downscale_stabilisation_window_secs as i32) as f64,
                select: Select::Max,
                policies: vec![ScalingPolicy {
                    kind: PolicyKind::Percent,
                    value: 100,
                    period_secs: 15.0,
                }],
            },
        }
    }
}

/// Go: timestampedScaleEvent{replicaChange int32; timestamp time.Time; outdated bool}
/// replicaChange is stored as an absolute (non-negative) value in both lists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleEvent {
    pub time: f64,
    pub replica_change: i32,
    pub outdated: bool,
}

/// Go: timestampedRecommendation{recommendation int32; timestamp time.Time}
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recommendation {
    pub time: f64,
    pub replicas: i32,
}

/// Per-HPA state. Upstream keeps these in maps keyed by "namespace/name"
/// (a.recommendations[key], a.scaleUpEvents[key], a.scaleDownEvents[key]); they are
/// only deleted when the HPA object is deleted (reconcileKey NotFound).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hpa {
    pub recommendations: Vec<Recommendation>,
    pub scale_up_events: Vec<ScaleEvent>,
    pub scale_down_events: Vec<ScaleEvent>,
}

/// Go: NormalizationArg (Key dropped: the Hpa value *is* the key's state).
#[derive(Clone, Copy, Debug)]
pub struct NormalizationArg<'a> {
    pub scale_up_behavior: &'a Rules,
    pub scale_down_behavior: &'a Rules,
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub current_replicas: i32,
    pub desired_replicas: i32,
}

/// Everything `step` observed, for tests that want more than (desired, reason).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutcome {
    /// Final replica count written to status.desiredReplicas (== current when no rescale).
    pub desired: i32,
    /// Reason returned by `step` (see `step` doc).
    pub reason: &'static str,
    /// Reason set on the AbleToScale condition by normalize*: "ScaleUpStabilized",
    /// "ScaleDownStabilized" or "ReadyForNewScale"; None if normalize was not run.
    pub able_to_scale_reason: Option<&'static str>,
    /// Status of the ScalingLimited condition (desired != stabilized); None if not run.
    pub scaling_limited: Option<bool>,
    /// Output of the stabilization stage; None if normalize was not run.
    pub stabilized: Option<i32>,
    /// Whether the scale subresource was updated (and a scale event stored).
    pub rescale: bool,
}

// ---------------------------------------------------------------------------
// Go-semantics helpers
// ---------------------------------------------------------------------------

/// time.Time.Before: strictly earlier.
fn before(t: f64, cutoff: f64) -> bool {
    t < cutoff
}

/// time.Time.After: strictly later.
fn after(t: f64, cutoff: f64) -> bool {
    t > cutoff
}

/// Go `int32(f)` for a float64. In range: truncation toward zero (identical to Rust
/// `as`). Out of range / NaN is implementation-specific in Go; on amd64 (CVTTSD2SL)
/// it yields 0x80000000, which is mimicked here (Rust `as` would saturate instead).
fn go_int32_from_f64(f: f64) -> i32 {
    if f.is_nan() || f >= 2147483648.0 || f <= -2147483649.0 {
        i32::MIN
    } else {
        f as i32
    }
}

/// [L] horizontal.go:max / [M] builtin max / maxInt32: `if a >= b { a } else { b }`.
fn go_max(a: i32, b: i32) -> i32 {
    if a >= b { a } else { b }
}

/// [L] horizontal.go:min / [M] builtin min / minInt32: `if a <= b { a } else { b }`.
fn go_min(a: i32, b: i32) -> i32 {
    if a <= b { a } else { b }
}

// ---------------------------------------------------------------------------
// replica_calculator.go
// ---------------------------------------------------------------------------

/// Transcribes pkg/controller/podautoscaler/replica_calculator.go:Tolerances.isWithin
/// (kubernetes master [M]).
pub fn tolerances_is_within(scale_down_tol: f64, scale_up_tol: f64, usage_ratio: f64) -> bool {
    (1.0 - scale_down_tol) <= usage_ratio && usage_ratio <= (1.0 + scale_up_tol)
}

// Transcribes pkg/controller/podautoscaler/replica_calculator.go:GetExternalPerPodMetricReplicas (kubernetes master [M], adrianmoisey/kubernetes@786f7bb / omerap12/kubernetes@a769d58)
/// AverageValue external target. `current` is what the controller passes:
/// **scale.Status.Replicas** (statusReplicas), NOT scale.Spec.Replicas (see
/// horizontal.go:computeStatusForExternalMetric). Symmetric tolerance
/// (Tolerances{tol, tol}, which is what the controller uses unless the
/// HPAConfigurableTolerance gate is on and spec.behavior.scale{Up,Down}.tolerance is set).
///
/// Upstream `usage` is an int64 sum of milli-values and the target is
/// Quantity.MilliValue() (int64); pass milli-scaled integral values as f64 to reproduce
/// upstream float rounding exactly.
///
/// current == 0: usageRatio = usage / (target*0) = +Inf (usage>0) or NaN (usage==0);
/// isWithin(+Inf) and isWithin(NaN) are both false, so the result is
/// ceil(usage/target) (which is 0 for usage == 0). There is no special-case branch.
pub fn external_per_pod_replicas(
    current: i32,
    metric_total: f64,
    target_per_pod: f64,
    tolerance: f64,
) -> i32 {
    external_per_pod_replicas_with_tolerances(
        current,
        metric_total,
        target_per_pod,
        tolerance,
        tolerance,
    )
}

// Transcribes pkg/controller/podautoscaler/replica_calculator.go:GetExternalPerPodMetricReplicas (kubernetes master [M]) -- asymmetric Tolerances form
pub fn external_per_pod_replicas_with_tolerances(
    status_replicas: i32,
    usage: f64,
    target_usage_per_pod: f64,
    scale_down_tol: f64,
    scale_up_tol: f64,
) -> i32 {
    // (int64 overflow clamp of the usage sum omitted: usage is already a float here)
    let mut replica_count = status_replicas;
    let usage_ratio = usage / (target_usage_per_pod * (replica_count as f64));
    if !tolerances_is_within(scale_down_tol, scale_up_tol, usage_ratio) {
        // update number of replicas if the change is large enough
        let replica_count_result = (usage / target_usage_per_pod).ceil();
        // Ensure that the result exceeds the bounds of an int32
        if replica_count_result > (i32::MAX as f64) {
            replica_count = i32::MAX;
        } else {
            replica_count = go_int32_from_f64(replica_count_result);
        }
    }
    // usage = getPerPodUsage(usage, statusReplicas)  -- status only, not returned here
    replica_count
}

// Transcribes pkg/controller/podautoscaler/replica_calculator.go:GetExternalMetricReplicas + getUsageRatioReplicaCount (kubernetes master [M])
/// Value (not AverageValue) external target. Here `current` is **scale.Spec.Replicas**
/// (specReplicas), and `ready_pod_count` is the number of Running+Ready pods matching
/// the HPA's selector (getReadyPodsCount; upstream errors if the selector matches no pods).
pub fn external_value_replicas(
    current: i32,
    metric_total: f64,
    target_value: f64,
    tolerance: f64,
    ready_pod_count: i64,
) -> i32 {
    let usage_ratio = metric_total / target_value;
    let replica_count;
    if current != 0 {
        if tolerances_is_within(tolerance, tolerance, usage_ratio) {
            // return the current replicas if the change would be too small
            return current;
        }
        let replica_count_float = usage_ratio * (ready_pod_count as f64);
        if replica_count_float > (i32::MAX as f64) {
            replica_count = i32::MAX;
        } else {
            replica_count = go_int32_from_f64(replica_count_float.ceil());
        }
    } else {
        // Scale to zero or n pods depending on usageRatio
        replica_count = go_int32_from_f64(usage_ratio.ceil());
    }
    replica_count
}

// ---------------------------------------------------------------------------
// horizontal.go helpers that are identical in [M] and [L]
// ---------------------------------------------------------------------------

// Transcribes pkg/controller/podautoscaler/horizontal.go:getReplicasChangePerPeriod (kubernetes master [M]; identical in v1.21 kubernetes/kubernetes@00067268967e)
/// Sums replicaChange of events with timestamp STRICTLY after now - period. The
/// `outdated` flag is NOT consulted here.
pub fn get_replicas_change_per_period(
    period_secs: f64,
    scale_events: &[ScaleEvent],
    now: f64,
) -> i32 {
    let cutoff = now - period_secs;
    let mut replicas: i32 = 0;
    for rec in scale_events {
        if after(rec.time, cutoff) {
            replicas = replicas.wrapping_add(rec.replica_change);
        }
    }
    replicas
}

// Transcribes pkg/controller/podautoscaler/horizontal.go:getLongestPolicyPeriod (kubernetes master [M]; identical in v1.21)
pub fn get_longest_policy_period(scaling_rules: &Rules) -> f64 {
    let mut longest_policy_period: f64 = 0.0; // var longestPolicyPeriod int32
    for policy in &scaling_rules.policies {
        if policy.period_secs > longest_policy_period {
            longest_policy_period = policy.period_secs;
        }
    }
    longest_policy_period
}

// Transcribes pkg/controller/podautoscaler/horizontal.go:markScaleEventsOutdated (kubernetes master [M]; identical in v1.21)
/// Marks (never removes) events STRICTLY older than now - longestPolicyPeriod.
pub fn mark_scale_events_outdated(
    scale_events: &mut [ScaleEvent],
    longest_policy_period: f64,
    now: f64,
) {
    let cutoff = now - longest_policy_period;
    for event in scale_events.iter_mut() {
        if before(event.time, cutoff) {
            // outdated scale event are marked for later reuse
            event.outdated = true;
        }
    }
}

// Transcribes pkg/controller/podautoscaler/horizontal.go:calculateScaleUpLimit (kubernetes master [M]; identical in v1.21)
/// Only used on the behavior == nil path.
pub fn calculate_scale_up_limit(current_replicas: i32) -> i32 {
    const SCALE_UP_LIMIT_FACTOR: f64 = 2.0;
    const SCALE_UP_LIMIT_MINIMUM: f64 = 4.0;
    go_int32_from_f64(
        (SCALE_UP_LIMIT_FACTOR * (current_replicas as f64)).max(SCALE_UP_LIMIT_MINIMUM),
    )
}

// Transcribes pkg/controller/podautoscaler/horizontal.go:convertDesiredReplicasWithRules (kubernetes master [M]; identical in v1.21)
/// Only used on the behavior == nil path. Note: min is checked BEFORE max here.
pub fn convert_desired_replicas_with_rules(
    current_replicas: i32,
    desired_replicas: i32,
    hpa_min_replicas: i32,
    hpa_max_replicas: i32,
) -> (i32, &'static str, &'static str) {
    let minimum_allowed_replicas = hpa_min_replicas;
    let maximum_allowed_replicas;
    let mut possible_limiting_condition;
    let mut possible_limiting_reason;

    let scale_up_limit = calculate_scale_up_limit(current_replicas);

    if hpa_max_replicas > scale_up_limit {
        maximum_allowed_replicas = scale_up_limit;
        possible_limiting_condition = "ScaleUpLimit";
        possible_limiting_reason =
            "the desired replica count is increasing faster than the maximum scale rate";
    } else {
        maximum_allowed_replicas = hpa_max_replicas;
        possible_limiting_condition = "TooManyReplicas";
        possible_limiting_reason =
            "the desired replica count is more than the maximum replica count";
    }

    if desired_replicas < minimum_allowed_replicas {
        possible_limiting_condition = "TooFewReplicas";
        possible_limiting_reason =
            "the desired replica count is less than the minimum replica count";
        return (
            minimum_allowed_replicas,
            possible_limiting_condition,
            possible_limiting_reason,
        );
    } else if desired_replicas > maximum_allowed_replicas {
        return (
            maximum_allowed_replicas,
            possible_limiting_condition,
            possible_limiting_reason,
        );
    }

    (
        desired_replicas,
        "DesiredWithinRange",
        "the desired count is within the acceptable range",
    )
}

// ---------------------------------------------------------------------------
// horizontal.go, master [M]: rate limits (take BOTH event lists)
// ---------------------------------------------------------------------------

// Transcribes pkg/controller/podautoscaler/horizontal.go:calculateScaleUpLimitWithScalingRules (kubernetes master [M], adrianmoisey/kubernetes@786f7bb / omerap12/kubernetes@a769d58)
pub fn calculate_scale_up_limit_with_scaling_rules(
    current_replicas: i32,
    scale_up_events: &[ScaleEvent],
    scale_down_events: &[ScaleEvent],
    scaling_rules: &Rules,
    now: f64,
) -> i32 {
    let mut result: i32;
    let mut proposed: i32 = 0; // var proposed int32 (keeps previous value across iterations)
    let select_policy_fn: fn(i32, i32) -> i32;
    if scaling_rules.select == Select::Disabled {
        return current_replicas; // Scaling is disabled
    } else if scaling_rules.select == Select::Min {
        result = i32::MAX;
        select_policy_fn = go_min; // For scaling up, the lowest change ('min' policy) produces a minimum value
    } else {
        result = i32::MIN;
        select_policy_fn = go_max; // Use the default policy otherwise to produce a highest possible change
    }
    for policy in &scaling_rules.policies {
        let replicas_added_in_current_period =
            get_replicas_change_per_period(policy.period_secs, scale_up_events, now);
        let replicas_deleted_in_current_period =
            get_replicas_change_per_period(policy.period_secs, scale_down_events, now);
        let period_start_replicas = current_replicas
            .wrapping_sub(replicas_added_in_current_period)
            .wrapping_add(replicas_deleted_in_current_period);
        if policy.kind == PolicyKind::Pods {
            proposed = period_start_replicas.wrapping_add(policy.value);
        } else if policy.kind == PolicyKind::Percent {
            // the proposal has to be rounded up because the proposed change might not increase the replica count causing the target to never scale up
            proposed = go_int32_from_f64(
                ((period_start_replicas as f64) * (1.0 + (policy.value as f64) / 100.0)).ceil(),
            );
        }
        result = select_policy_fn(result, proposed);
    }
    result
}

// Transcribes pkg/controller/podautoscaler/horizontal.go:calculateScaleDownLimitWithBehaviors (kubernetes master [M], adrianmoisey/kubernetes@786f7bb / omerap12/kubernetes@a769d58)
pub fn calculate_scale_down_limit_with_behaviors(
    current_replicas: i32,
    scale_up_events: &[ScaleEvent],
    scale_down_events: &[ScaleEvent],
    scaling_rules: &Rules,
    now: f64,
) -> i32 {
    let mut result: i32;
    let mut proposed: i32 = 0;
    let select_policy_fn: fn(i32, i32) -> i32;
    if scaling_rules.select == Select::Disabled {
        return current_replicas; // Scaling is disabled
    } else if scaling_rules.select == Select::Min {
        result = i32::MIN;
        select_policy_fn = go_max; // For scaling down, the lowest change ('min' policy) produces a maximum value
    } else {
        result = i32::MAX;
        select_policy_fn = go_min; // Use the default policy otherwise to produce a highest possible change
    }
    for policy in &scaling_rules.policies {
        let replicas_added_in_current_period =
            get_replicas_change_per_period(policy.period_secs, scale_up_events, now);
        let replicas_deleted_in_current_period =
            get_replicas_change_per_period(policy.period_secs, scale_down_events, now);
        let period_start_replicas = current_replicas
            .wrapping_sub(replicas_added_in_current_period)
            .wrapping_add(replicas_deleted_in_current_period);
        if policy.kind == PolicyKind::Pods {
            proposed = period_start_replicas.wrapping_sub(policy.value);
        } else if policy.kind == PolicyKind::Percent {
            // NOTE: truncation (int32 conversion), NOT math.Floor/Ceil
            proposed = go_int32_from_f64(
                (period_start_replicas as f64) * (1.0 - (policy.value as f64) / 100.0),
            );
        }
        result = select_policy_fn(result, proposed);
    }
    result
}

// ---------------------------------------------------------------------------
// Hpa methods
// ---------------------------------------------------------------------------

impl Hpa {
    pub fn new() -> Hpa {
        Hpa::default()
    }

    // Transcribes pkg/controller/podautoscaler/horizontal.go:recordInitialRecommendation (kubernetes master [M]; identical in v1.21)
    /// Go checks `a.recommendations[key] == nil`. The slice only becomes non-nil via
    /// this function or stabilize*, and is never emptied (only replaced/appended), so
    /// "is_empty" is equivalent.
    pub fn record_initial_recommendation(&mut self, current_replicas: i32, now: f64) {
        if self.recommendations.is_empty() {
            self.recommendations = vec![Recommendation {
                time: now,
                replicas: current_replicas,
            }];
        }
    }

    // Transcribes pkg/controller/podautoscaler/horizontal.go:storeScaleEvent (kubernetes master [M]; identical in v1.21 kubernetes/kubernetes@00067268967e)
    /// Called only when rescale (desired != current). The list never shrinks: events
    /// older than the direction's longest policy period are marked outdated, and ONE of
    /// them (the LAST outdated index) is overwritten by the new event; otherwise append.
    /// newReplicas == prevReplicas would go to the scale-down branch (change 0), but
    /// the controller never calls it in that case.
    pub fn store_scale_event(
        &mut self,
        behavior: Option<&Behavior>,
        prev_replicas: i32,
        new_replicas: i32,
        now: f64,
    ) {
        let behavior = match behavior {
            None => return, // we should not store any event as they will not be used
            Some(b) => b,
        };
        let mut old_sample_index: usize = 0;
        let longest_policy_period: f64;
        let mut found_old_sample = false;
        if new_replicas > prev_replicas {
            longest_policy_period = get_longest_policy_period(&behavior.up);
            mark_scale_events_outdated(&mut self.scale_up_events, longest_policy_period, now);
            let replica_change = new_replicas.wrapping_sub(prev_replicas);
            for (i, event) in self.scale_up_events.iter().enumerate() {
                if event.outdated {
                    found_old_sample = true;
                    old_sample_index = i;
                }
            }
            let new_event = ScaleEvent {
                time: now,
                replica_change,
                outdated: false,
            };
            if found_old_sample {
                self.scale_up_events[old_sample_index] = new_event;
            } else {
                self.scale_up_events.push(new_event);
            }
        } else {
            longest_policy_period = get_longest_policy_period(&behavior.down);
            mark_scale_events_outdated(&mut self.scale_down_events, longest_policy_period, now);
            let replica_change = prev_replicas.wrapping_sub(new_replicas);
            for (i, event) in self.scale_down_events.iter().enumerate() {
                if event.outdated {
                    found_old_sample = true;
                    old_sample_index = i;
                }
            }
            let new_event = ScaleEvent {
                time: now,
                replica_change,
                outdated: false,
            };
            if found_old_sample {
                self.scale_down_events[old_sample_index] = new_event;
            } else {
                self.scale_down_events.push(new_event);
            }
        }
    }

    // ----------------------------- master [M] -----------------------------

    // Transcribes pkg/controller/podautoscaler/horizontal.go:stabilizeRecommendationWithBehaviors (kubernetes master [M], adrianmoisey/kubernetes@786f7bb / omerap12/kubernetes@a769d58)
    /// Both windows are evaluated on every call:
    ///   up   = min(desired, recs with t >  now - upWindow)
    ///   down = max(desired, recs with t >  now - downWindow)
    ///   result = current; if result < up {up}; if result > down {down}
    /// Stores the UNstabilized args.desired_replicas (replacing the last sample that is
    /// strictly older than BOTH cutoffs, else appending).
    pub fn stabilize_recommendation_with_behaviors(
        &mut self,
        args: &NormalizationArg,
        now: f64,
    ) -> (i32, &'static str, &'static str) {
        let mut found_old_sample = false;
        let mut old_sample_index: usize = 0;

        let mut up_recommendation = args.desired_replicas;
        let up_delay_seconds = args.scale_up_behavior.stabilization_window_secs;
        let up_cutoff = now - up_delay_seconds;

        let mut down_recommendation = args.desired_replicas;
        let down_delay_seconds = args.scale_down_behavior.stabilization_window_secs;
        let down_cutoff = now - down_delay_seconds;

        // Calculate the upper and lower stabilization limits.
        for (i, rec) in self.recommendations.iter().enumerate() {
            if after(rec.time, up_cutoff) {
                up_recommendation = go_min(rec.replicas, up_recommendation);
            }
            if after(rec.time, down_cutoff) {
                down_recommendation = go_max(rec.replicas, down_recommendation);
            }
            if before(rec.time, up_cutoff) && before(rec.time, down_cutoff) {
                found_old_sample = true;
                old_sample_index = i;
            }
        }

        // Bring the recommendation to within the upper and lower limits (stabilize).
        let mut recommendation = args.current_replicas;
        if recommendation < up_recommendation {
            recommendation = up_recommendation;
        }
        if recommendation > down_recommendation {
            recommendation = down_recommendation;
        }

        // Record the unstabilized recommendation.
        let new_rec = Recommendation {
            time: now,
            replicas: args.desired_replicas,
        };
        if found_old_sample {
            self.recommendations[old_sample_index] = new_rec;
        } else {
            self.recommendations.push(new_rec);
        }

        // Determine a human-friendly message.
        let (reason, message);
        if args.desired_replicas >= args.current_replicas {
            reason = "ScaleUpStabilized";
            message = "recent recommendations were lower than current one, applying the lowest recent recommendation";
        } else {
            reason = "ScaleDownStabilized";
            message = "recent recommendations were higher than current one, applying the highest recent recommendation";
        }
        (recommendation, reason, message)
    }

    // Transcribes pkg/controller/podautoscaler/horizontal.go:convertDesiredReplicasWithBehaviorRate (kubernetes master [M], adrianmoisey/kubernetes@786f7bb / omerap12/kubernetes@a769d58)
    /// Order: rate limit is computed first, clamped so it never goes past current
    /// (scaleUpLimit < current -> current; scaleDownLimit > current -> current), then
    /// combined with max/min: the SMALLER of (maxReplicas, scaleUpLimit) wins; when
    /// they are equal the reason is "TooManyReplicas" (strict `>`). Symmetric for down
    /// ("TooFewReplicas" on ties). maxReplicas is only applied when desired > current
    /// and minReplicas only when desired < current.
    pub fn convert_desired_replicas_with_behavior_rate(
        &self,
        args: &NormalizationArg,
        now: f64,
    ) -> (i32, &'static str, &'static str) {
        let possible_limiting_reason: &'static str;
        let possible_limiting_message: &'static str;

        if args.desired_replicas > args.current_replicas {
            let mut scale_up_limit = calculate_scale_up_limit_with_scaling_rules(
                args.current_replicas,
                &self.scale_up_events,
                &self.scale_down_events,
                args.scale_up_behavior,
                now,
            );

            if scale_up_limit < args.current_replicas {
                // We shouldn't scale up further until the scaleUpEvents will be cleaned up
                scale_up_limit = args.current_replicas;
            }
            let mut maximum_allowed_replicas = args.max_replicas;
            if maximum_allowed_replicas > scale_up_limit {
                maximum_allowed_replicas = scale_up_limit;
                possible_limiting_reason = "ScaleUpLimit";
                possible_limiting_message =
                    "the desired replica count is increasing faster than the maximum scale rate";
            } else {
                possible_limiting_reason = "TooManyReplicas";
                possible_limiting_message =
                    "the desired replica count is more than the maximum replica count";
            }
            if args.desired_replicas > maximum_allowed_replicas {
                return (
                    maximum_allowed_replicas,
                    possible_limiting_reason,
                    possible_limiting_message,
                );
            }
        } else if args.desired_replicas < args.current_replicas {
            let mut scale_down_limit = calculate_scale_down_limit_with_behaviors(
                args.current_replicas,
                &self.scale_up_events,
                &self.scale_down_events,
                args.scale_down_behavior,
                now,
            );

            if scale_down_limit > args.current_replicas {
                // We shouldn't scale down further until the scaleDownEvents will be cleaned up
                scale_down_limit = args.current_replicas;
            }
            let mut minimum_allowed_replicas = args.min_replicas;
            if minimum_allowed_replicas < scale_down_limit {
                minimum_allowed_replicas = scale_down_limit;
                possible_limiting_reason = "ScaleDownLimit";
                possible_limiting_message =
                    "the desired replica count is decreasing faster than the maximum scale rate";
            } else {
                possible_limiting_message =
                    "the desired replica count is less than the minimum replica count";
                possible_limiting_reason = "TooFewReplicas";
            }
            if args.desired_replicas < minimum_allowed_replicas {
                return (
                    minimum_allowed_replicas,
                    possible_limiting_reason,
                    possible_limiting_message,
                );
            }
        }
        (
            args.desired_replicas,
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
        )
    }

    // Transcribes pkg/controller/podautoscaler/horizontal.go:normalizeDesiredReplicasWithBehaviors (kubernetes master [M], adrianmoisey/kubernetes@786f7bb / omerap12/kubernetes@a769d58)
    /// Returns (desired, AbleToScale reason, ScalingLimited reason, ScalingLimited status, stabilized).
    /// maybeInitScaleDownStabilizationWindow is a no-op here (windows are always set).
    pub fn normalize_desired_replicas_with_behaviors(
        &mut self,
        b: &Behavior,
        current_replicas: i32,
        prenormalized_desired_replicas: i32,
        min_replicas: i32,
        max_replicas: i32,
        now: f64,
    ) -> (i32, &'static str, &'static str, bool, i32) {
        let mut normalization_arg = NormalizationArg {
            scale_up_behavior: &b.up,
            scale_down_behavior: &b.down,
            min_replicas,
            max_replicas,
            current_replicas,
            desired_replicas: prenormalized_desired_replicas,
        };
        let (stabilized_recommendation, reason, _message) =
            self.stabilize_recommendation_with_behaviors(&normalization_arg, now);
        normalization_arg.desired_replicas = stabilized_recommendation;
        let able_to_scale_reason = if stabilized_recommendation != prenormalized_desired_replicas {
            // "ScaleUpStabilized" || "ScaleDownStabilized"
            reason
        } else {
            "ReadyForNewScale"
        };
        let (desired_replicas, reason, _message) =
            self.convert_desired_replicas_with_behavior_rate(&normalization_arg, now);
        // setCondition(ScalingLimited, desiredReplicas == stabilizedRecommendation ? False : True, reason, message)
        let scaling_limited = desired_replicas != stabilized_recommendation;
        (
            desired_replicas,
            able_to_scale_reason,
            reason,
            scaling_limited,
            stabilized_recommendation,
        )
    }

    /// The behavior path of horizontal.go:reconcileAutoscaler (master [M]), after the
    /// metric proposal has been computed. Returns (desired replicas, reason):
    ///  * normal path: the ScalingLimited condition reason from
    ///    convertDesiredReplicasWithBehaviorRate: "ScaleUpLimit", "TooManyReplicas",
    ///    "ScaleDownLimit", "TooFewReplicas" or "DesiredWithinRange";
    ///  * current == 0: "ScalingDisabled" (ScalingActive=False condition reason),
    ///    desired 0, nothing recorded except the initial recommendation;
    ///  * current > max: desired = max, reason is upstream's rescaleReason string
    ///    "Current number of replicas above Spec.MaxReplicas" (no condition reason is
    ///    set upstream on this path; stabilization/rate limits are NOT applied, no
    ///    recommendation is stored, but a scale event IS stored);
    ///  * current < min: likewise, "Current number of replicas below Spec.MinReplicas".
    /// `current` must be scale.Spec.Replicas. `proposal` is the max over metrics of the
    /// per-metric proposals (one external metric -> that metric's proposal).
    pub fn step(
        &mut self,
        now: f64,
        current: i32,
        proposal: i32,
        min: i32,
        max: i32,
        b: &Behavior,
    ) -> (i32, &'static str) {
        let o = self.step_detailed(now, current, proposal, min, max, b);
        (o.desired, o.reason)
    }

    // Transcribes pkg/controller/podautoscaler/horizontal.go:reconcileAutoscaler (kubernetes master [M]) -- the replica-count part only, HPAScaleToZero feature gate OFF (its default)
    /// With the gate off, shouldComputeMetricsForZeroReplicas(min, false, false)
    /// returns (false, true) for ANY minReplicas, so current == 0 always means
    /// "ScalingDisabled" in master (v1.21 only did so when minReplicas != 0).
    /// The gate-on scale-from-zero path (depends on the HPA's own ScaledToZero
    /// condition) is not modelled.
    pub fn step_detailed(
        &mut self,
        now: f64,
        current: i32,
        proposal: i32,
        min: i32,
        max: i32,
        b: &Behavior,
    ) -> StepOutcome {
        let current_replicas = current;
        self.record_initial_recommendation(current_replicas, now);

        let mut desired_replicas: i32 = 0;
        let min_replicas = min; // hpa.Spec.MinReplicas (API default 1)
        let mut rescale = true;
        let mut needs_metric_computation = true;
        let mut reason: &'static str = "";
        let mut able_to_scale_reason = None;
        let mut scaling_limited = None;
        let mut stabilized = None;

        if current_replicas == 0 {
            // needsMetricComputation, shouldDisable = shouldComputeMetricsForZeroReplicas(minReplicas, false, false) == (false, true)
            needs_metric_computation = false;
            desired_replicas = 0;
            rescale = false;
            reason = "ScalingDisabled";
        } else if current_replicas > max {
            reason = "Current number of replicas above Spec.MaxReplicas";
            desired_replicas = max;
            needs_metric_computation = false;
        } else if current_replicas < min_replicas {
            reason = "Current number of replicas below Spec.MinReplicas";
            desired_replicas = min_replicas;
            needs_metric_computation = false;
        }

        if needs_metric_computation {
            let metric_desired_replicas = proposal;
            if metric_desired_replicas > desired_replicas {
                desired_replicas = metric_desired_replicas;
            }
            let (d, ats, sl_reason, sl, st) = self.normalize_desired_replicas_with_behaviors(
                b,
                current_replicas,
                desired_replicas,
                min_replicas,
                max,
                now,
            );
            desired_replicas = d;
            reason = sl_reason;
            able_to_scale_reason = Some(ats);
            scaling_limited = Some(sl);
            stabilized = Some(st);
            rescale = desired_replicas != current_replicas;
        }
        if rescale {
            self.store_scale_event(Some(b), current_replicas, desired_replicas, now);
        } else {
            desired_replicas = current_replicas;
        }
        StepOutcome {
            desired: desired_replicas,
            reason,
            able_to_scale_reason,
            scaling_limited,
            stabilized,
            rescale,
        }
    }
}

// ---------------------------------------------------------------------------
// Sanity tests (hand-computed from the Go source)
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(window: f64, select: Select, policies: Vec<ScalingPolicy>) -> Rules {
        Rules {
            stabilization_window_secs: window,
            select,
            policies,
        }
    }
    fn pods(v: i32, p: f64) -> ScalingPolicy {
        ScalingPolicy {
            kind: PolicyKind::Pods,
            value: v,
            period_secs: p,
        }
    }
    fn pct(v: i32, p: f64) -> ScalingPolicy {
        ScalingPolicy {
            kind: PolicyKind::Percent,
            value: v,
            period_secs: p,
        }
    }

    #[test]
    fn default_scale_up_rate_and_period_boundary() {
        let b = Behavior::k8s_default(300.0);
        let mut h = Hpa::new();
        // Pods: 1+4=5, Percent: ceil(1*2)=2, Max -> 5
        assert_eq!(h.step(0.0, 1, 10, 1, 100, &b), (5, "ScaleUpLimit"));
        assert_eq!(
            h.scale_up_events,
            vec![ScaleEvent {
                time: 0.0,
                replica_change: 4,
                outdated: false
            }]
        );
        // at t=14 the +4 event is inside the 15s period: start=1 -> limit 5 == current -> no rescale
        let mut h2 = h.clone();
        assert_eq!(h2.step(14.0, 5, 10, 1, 100, &b), (5, "ScaleUpLimit"));
        // at t=15 the event is exactly at the cutoff; After() is strict -> not counted
        // start=5 -> Pods 9, Percent 10 -> 10
        assert_eq!(h.step(15.0, 5, 10, 1, 100, &b), (10, "DesiredWithinRange"));
    }

    #[test]
    fn tie_between_max_and_rate_limit_is_too_many() {
        let b = Behavior::k8s_default(300.0);
        let mut h = Hpa::new();
        // limit 5, max 5 -> `max > limit` false -> TooManyReplicas
        assert_eq!(h.step(0.0, 1, 10, 1, 5, &b), (5, "TooManyReplicas"));
    }

    #[test]
    fn scale_down_stabilization_window() {
        let b = Behavior::k8s_default(300.0);
        let mut h = Hpa::new();
        assert_eq!(h.step(0.0, 10, 10, 1, 100, &b), (10, "DesiredWithinRange"));
        // proposal 2 at t=15: down window holds 10 (t=0) -> stabilized to 10
        let o = h.step_detailed(15.0, 10, 2, 1, 100, &b);
        assert_eq!(
            (o.desired, o.stabilized, o.able_to_scale_reason),
            (10, Some(10), Some("ScaleDownStabilized"))
        );
        // t=300: samples at t=0 are at exactly now-300 -> not After -> excluded; t=15 (2) remains
        let o = h.step_detailed(300.0, 10, 2, 1, 100, &b);
        assert_eq!(o.stabilized, Some(2));
        // Percent 100 down -> int32(10*0) = 0 -> limit 0 < min 1 -> TooFewReplicas, 2 >= 1 -> within
        assert_eq!((o.desired, o.reason), (2, "DesiredWithinRange"));
    }

    #[test]
    fn scale_down_percent_truncates() {
        let b = Behavior {
            up: rules(0.0, Select::Max, vec![pods(4, 15.0)]),
            down: rules(0.0, Select::Max, vec![pct(10, 60.0)]),
        };
        let mut h = Hpa::new();
        // int32(15 * 0.9) = int32(13.5) = 13
        assert_eq!(h.step(0.0, 15, 1, 1, 100, &b), (13, "ScaleDownLimit"));
        // next 60s: start = 13 + 2 = 15 -> 13 again -> limit 13 == current -> held
        assert_eq!(h.step(30.0, 13, 1, 1, 100, &b), (13, "ScaleDownLimit"));
    }

    #[test]
    fn external_per_pod() {
        // ratio 1.1, tol 0.1: within in master (v1.21's |1 - r| > tol,
        // 0.10000000000000009, scaled)
        assert_eq!(external_per_pod_replicas(10, 11000.0, 1000.0, 0.1), 10);
        assert_eq!(external_per_pod_replicas(2, 5000.0, 1000.0, 0.1), 5);
        // current == 0
        assert_eq!(external_per_pod_replicas(0, 2500.0, 1000.0, 0.1), 3);
        assert_eq!(external_per_pod_replicas(0, 0.0, 1000.0, 0.1), 0);
    }

    #[test]
    fn events_are_replaced_not_pruned() {
        let b = Behavior::k8s_default(0.0);
        let mut h = Hpa::new();
        h.store_scale_event(Some(&b), 1, 5, 0.0);
        h.store_scale_event(Some(&b), 5, 7, 10.0);
        // at t=20: cutoff 5 -> event@0 outdated and replaced; event@10 kept
        h.store_scale_event(Some(&b), 7, 8, 20.0);
        assert_eq!(h.scale_up_events.len(), 2);
        assert_eq!(
            h.scale_up_events[0],
            ScaleEvent {
                time: 20.0,
                replica_change: 1,
                outdated: false
            }
        );
        assert_eq!(
            h.scale_up_events[1],
            ScaleEvent {
                time: 10.0,
                replica_change: 2,
                outdated: false
            }
        );
    }
}
