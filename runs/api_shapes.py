"""The shapes of the API answers written without a model serializer (chart data, a run's
series and log tail), declared for the OpenAPI schema so it documents what is really sent.
Only drf-spectacular reads these; the views build their answers directly."""

from __future__ import annotations

from rest_framework import serializers


class RunLogsSerializer(serializers.Serializer):
    logs = serializers.CharField(help_text="The tail of the run's log; empty before it starts.")


class RunSeriesKeysSerializer(serializers.Serializer):
    keys = serializers.ListField(child=serializers.CharField(), help_text="Keys with points.")


class RunSeriesSerializer(serializers.Serializer):
    key = serializers.CharField()
    total = serializers.IntegerField(help_text="How many points the run logged for the key.")
    downsampled = serializers.BooleanField()
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="[step, value] pairs in step order; downsampled: each range's min and max.",
    )


class ChartRunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # a field named "label"
    baseline = serializers.BooleanField()
    axes = serializers.DictField(help_text="The run's value of each grid axis of its plan.")
    url = serializers.CharField(help_text="The run's page.")


class ChartLineSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    step = serializers.ListField(child=serializers.FloatField())
    value = serializers.ListField(child=serializers.FloatField(allow_null=True))
    min = serializers.ListField(child=serializers.FloatField(allow_null=True))
    max = serializers.ListField(child=serializers.FloatField(allow_null=True))


class ChartMetricSerializer(serializers.Serializer):
    label = serializers.CharField(  # type: ignore[assignment]  # a field named "label"
        help_text="The declared display name, or the key."
    )
    title = serializers.CharField(help_text="The axis title with its unit, e.g. 'MFU (%)'.")
    unit = serializers.CharField(help_text="The unit the values are in ('' when undeclared).")
    format = serializers.ChoiceField(
        choices=["percent", "fraction", "count", "si", "seconds", "number"],
        help_text="How the axis ticks are written (static/js/units.js).",
    )


class ChartDataSerializer(serializers.Serializer):
    plan = serializers.IntegerField(required=False, help_text="The plan, for a plan's charts.")
    active = serializers.BooleanField(help_text="Whether anything can still change (poll again).")
    keys = serializers.ListField(child=serializers.CharField())
    runs = ChartRunSerializer(many=True)
    metrics = serializers.DictField(
        child=ChartMetricSerializer(),
        help_text="How each key is shown (runs.metrics.display); its values are in that unit.",
    )
    series = serializers.DictField(
        child=ChartLineSerializer(many=True),
        help_text="For each key, one line per run, in the unit `metrics` names.",
    )
