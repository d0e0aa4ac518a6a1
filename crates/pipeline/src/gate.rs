//! A rollout wave's gate (platform §12): one step of the §2 shape, run
//! once after the wave's bake. Its templates see `.Rollout.Api`,
//! `.Rollout.SyncID`, `.Rollout.Wave`, `.Rollout.Synced`, `.Rollout.Failed`
//! and `{{ secret "NAME" }}`; it succeeding or failing is the wave passing
//! or failing. It runs like a pipeline step, with the same redaction, cuts
//! and `wait` polling, stopped by the same controls.

use kayra_config::{ReconcilerConfig, Step};
use kayra_core::RunStep;

use crate::detached::DetachedRequests;
use crate::secrets::{Redactor, SecretSources};
use crate::step::CompiledStep;
use crate::template::{RolloutContext, Schema, Scope, with_schema};
use crate::{PipelineError, PipelineSettings, RunControl, SubscriptionContext};

/// A compiled gate step.
pub struct Gate {
    step: CompiledStep,
}

impl Gate {
    /// Parses and checks a gate as written in a registration: the step
    /// shape and every template. The error is `(field, message)`, the field
    /// relative to the gate (`endpoint`, `headers.X`).
    pub fn compile(gate: &serde_json::Value) -> Result<Self, (String, String)> {
        let step: Step = serde_json::from_value(gate.clone()).map_err(|e| (String::new(), e.to_string()))?;
        step.validate()?;
        let step = with_schema(Schema::Gate, || CompiledStep::compile(0, &step))?;
        Ok(Self { step })
    }

    /// Runs the gate once. Its secrets come from `reconciler.secrets`; one
    /// unknown there, or unreadable, fails the gate before any call.
    pub async fn run(
        &self,
        client: &reqwest::Client,
        config: &ReconcilerConfig,
        rollout: &RolloutContext,
        control: &RunControl,
    ) -> (Result<(), PipelineError>, RunStep) {
        let sources = SecretSources::new(&config.secrets);
        let names = self.step.secrets();
        let failed = |error: PipelineError| {
            let step =
                RunStep { method: self.step.method().to_string(), error: error.to_string(), ..RunStep::default() };
            (Err(error), step)
        };
        if let Some(name) = names.iter().find(|name| !sources.contains(name)) {
            let message = "unknown secret; define it under reconciler.secrets".to_string();
            return failed(PipelineError::Secret { name: name.clone(), message });
        }
        let secrets = match sources.read(&names).await {
            Ok(secrets) => secrets,
            Err(error) => return failed(error),
        };
        let redactor = Redactor::new(&secrets);
        let ctx = SubscriptionContext {
            api: rollout.api.clone(),
            expected_sync_id: rollout.sync_id.clone(),
            ..SubscriptionContext::default()
        };
        let settings = PipelineSettings::from(config);
        let detached = DetachedRequests::new(config.max_detached_requests);
        let env = crate::step::StepEnv {
            client,
            ctx: &ctx,
            settings: &settings,
            control,
            redactor: &redactor,
            detached: &detached,
        };
        let scope = Scope::for_rollout(rollout, secrets.into_shared());
        let outcome = self.step.run(scope, &env).await;
        let record = crate::record(&self.step, &outcome, &redactor);
        (outcome.result, record)
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("step", &self.step).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_reads_rollout_fields_and_nothing_of_a_subscription() {
        let gate = |endpoint: &str| Gate::compile(&serde_json::json!({"method": "get", "endpoint": endpoint}));
        gate("https://m.example.com/ok?api={{ .Rollout.Api }}&w={{ .Rollout.Wave }}&s={{ .Rollout.Synced }}")
            .expect("the .Rollout fields");
        let (field, message) = gate("https://m.example.com/{{ .Subscription.Namespace }}").unwrap_err();
        assert_eq!(field, "endpoint");
        assert!(message.contains(".Rollout.{Api, SyncID, Wave, Synced, Failed}"), "{message}");
        // A step's templates are checked as before, on the same thread.
        let step: Step =
            serde_json::from_value(serde_json::json!({"method": "get", "endpoint": "http://x/{{ .Rollout.Api }}"}))
                .unwrap();
        assert!(CompiledStep::compile(0, &step).is_err(), "a pipeline step sees no .Rollout");
        let (field, _) = Gate::compile(&serde_json::json!({"method": "get"})).unwrap_err();
        assert_eq!(field, "", "a gate without an endpoint is refused as a whole");
    }
}
