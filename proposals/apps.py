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
