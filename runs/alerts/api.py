"""API doors for alerts: the rules (public to read, maintainers write them) and the alerts
(public, read-only). Writes go through ``runs.alerts.services`` like the admin's."""

from __future__ import annotations

from typing import Any

from rest_framework import mixins, serializers, viewsets

from marin_site import api_input as policy
from marin_site.api import HasNamedPermission
from runs.alerts import selectors, services
from runs.alerts.models import Alert, AlertKind, AlertRule
from runs.models import Recipe, Run
from runs.permissions import MANAGE_ALERT_RULES


class AlertRuleSerializer(policy.ModelSerializer):
    recipe = serializers.PrimaryKeyRelatedField(
        queryset=Recipe.objects.all(), required=False, allow_null=True
    )
    run = serializers.PrimaryKeyRelatedField(
        queryset=Run.objects.all(), required=False, allow_null=True
    )
    kind = serializers.ChoiceField(choices=AlertKind.choices)
    key = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    params = serializers.JSONField(
        required=False,
        default=dict,
        help_text="Only the parameters to change; see runs/alerts/rules.py for each kind's.",
    )

    class Meta:
        model = AlertRule
        fields = ["id", "recipe", "run", "kind", "key", "params", "enabled", "updated_at"]
        read_only_fields = ["id", "updated_at"]
        validators: list[Any] = []  # the service checks uniqueness, naming the field


class AlertRuleViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Alert rules of recipes and runs; a stored rule replaces the recipe's default of the
    same kind and key, or switches it off (``enabled: false``)."""

    serializer_class = AlertRuleSerializer
    permission_classes = [HasNamedPermission]
    permission_name = MANAGE_ALERT_RULES
    filterset_fields = ["recipe", "run", "kind"]
    queryset = AlertRule.objects.order_by("pk")

    def _save(self, serializer: Any, rule: AlertRule | None) -> None:
        data = dict(serializer.validated_data)
        current = (
            {}
            if rule is None
            else {
                "recipe": rule.recipe,
                "run": rule.run,
                "kind": rule.kind,
                "key": rule.key,
                "params": rule.params,
                "enabled": rule.enabled,
            }
        )
        merged = {**current, **data}
        serializer.instance = services.alert_rule_save(
            actor=self.request.user,
            kind=merged["kind"],
            key=merged.get("key", ""),
            params=merged.get("params", {}),
            enabled=merged.get("enabled", True),
            recipe=merged.get("recipe"),
            run=merged.get("run"),
            rule=rule,
        )

    def perform_create(self, serializer: Any) -> None:
        self._save(serializer, None)

    def perform_update(self, serializer: Any) -> None:
        self._save(serializer, serializer.instance)

    def perform_destroy(self, instance: AlertRule) -> None:
        services.alert_rule_delete(actor=self.request.user, rule=instance)


class AlertSerializer(policy.ModelSerializer):
    is_open = serializers.BooleanField(read_only=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "run",
            "kind",
            "key",
            "message",
            "is_open",
            "opened_at",
            "opened_step",
            "opened_value",
            "closed_at",
            "closed_step",
            "close_message",
        ]
        read_only_fields = fields


class AlertViewSet(viewsets.ReadOnlyModelViewSet[Alert]):
    """Alerts on runs' metrics, newest first; ``?run=`` and ``?kind=`` filter them."""

    serializer_class = AlertSerializer
    filterset_fields = ["run", "kind"]

    def get_queryset(self) -> Any:
        return selectors.alert_list()
