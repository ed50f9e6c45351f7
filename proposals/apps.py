from django.apps import AppConfig


class ProposalsConfig(AppConfig):
    name = "proposals"
    verbose_name = "Proposals and reviews"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing these registers the permission rules and connects every receiver.
        from marin_site import invalidation
        from proposals import permissions, receivers  # noqa: F401
        from proposals.github import receivers as github_receivers  # noqa: F401
        from proposals.invalidation import RULES

        invalidation.register("proposals", *RULES)
        _links_register()
        from proposals import importers

        importers.register()


def _links_register() -> None:
    """The fields whose links ``manage.py links_rewrite`` moves when a host moves (bodies and
    links people wrote; never the timeline or the webhook bodies GitHub signed)."""
    from marin_site import links
    from proposals.models import Comment, Proposal, Review

    links.rewritable_register(
        Proposal,
        "description",
        "hypothesis",
        "conclusion",
        "results",
        "pr_url",
        "wandb_url",
        "data_browser_url",
        "experiment_json_url",
    )
    links.rewritable_register(Comment, "body")
    links.rewritable_register(Review, "text")
