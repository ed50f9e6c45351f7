"""Full-text search of proposals.

Adds ``Proposal.search_vector``. On PostgreSQL a trigger fills it on every insert and on every
update of the text columns (so bulk_create, queryset updates and raw SQL keep it right), and a
GIN index serves ``search_vector @@ query``. Title weighs most (A), then summary (B),
hypothesis (C) and description (D); ``pg_catalog.english`` stems words, and the queries in
proposals/search.py use the same configuration. On SQLite the column stays NULL: search
falls back to substring matching there.
"""

from django.contrib.postgres.search import SearchVectorField
from django.db import migrations

FORWARD = [
    """
    CREATE FUNCTION proposals_proposal_search_vector() RETURNS trigger AS $$
    BEGIN
        NEW.search_vector :=
            setweight(to_tsvector('pg_catalog.english', coalesce(NEW.title, '')), 'A')
            || setweight(to_tsvector('pg_catalog.english', coalesce(NEW.summary, '')), 'B')
            || setweight(to_tsvector('pg_catalog.english', coalesce(NEW.hypothesis, '')), 'C')
            || setweight(to_tsvector('pg_catalog.english', coalesce(NEW.description, '')), 'D');
        RETURN NEW;
    END
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER proposals_proposal_search_vector_update
    BEFORE INSERT OR UPDATE OF title, summary, description, hypothesis, search_vector
    ON proposals_proposal FOR EACH ROW EXECUTE FUNCTION proposals_proposal_search_vector()
    """,
    "CREATE INDEX proposal_search_vector_gin ON proposals_proposal USING gin (search_vector)",
    # Fill the rows that exist: naming search_vector in SET fires the trigger.
    "UPDATE proposals_proposal SET search_vector = NULL",
]

BACKWARD = [
    "DROP INDEX IF EXISTS proposal_search_vector_gin",
    "DROP TRIGGER IF EXISTS proposals_proposal_search_vector_update ON proposals_proposal",
    "DROP FUNCTION IF EXISTS proposals_proposal_search_vector()",
]


def _run_on_postgresql(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for statement in statements:
            schema_editor.execute(statement, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("proposals", "0002_github_sync"),
    ]

    operations = [
        migrations.AddField(
            model_name="proposal",
            name="search_vector",
            field=SearchVectorField(editable=False, null=True),
        ),
        migrations.RunPython(_run_on_postgresql(FORWARD), _run_on_postgresql(BACKWARD)),
    ]
