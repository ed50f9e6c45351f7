from django.apps import AppConfig


class ProposalsConfig(AppConfig):
    name = "proposals"
    verbose_name = "Proposals and reviews"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from marin_site.pagecache import invalidate_on_change
        from proposals import (
            models,
            permissions,  # noqa: F401  (registers the rules)
            services,
        )
        from proposals.github import receivers  # GitHub sync: listens to what runs/ announces
        from runs import signals as run_signals

        invalidate_on_change(
            models.Proposal,
            models.Proposal.labels.through,
            models.Review,
            models.Comment,
            models.Amendment,
            models.Event,
            models.Label,
        )

        run_signals.run_state_changed.connect(
            receivers.on_run_state_changed, dispatch_uid="proposals.github.run_state_changed"
        )
        run_signals.plan_finished.connect(
            receivers.on_plan_finished, dispatch_uid="proposals.github.plan_finished"
        )
        run_signals.reconcile_pass.connect(
            services.proposal_plans_reconcile, dispatch_uid="proposals.plans_reconcile"
        )
