"""Everything that speaks SQL: connections, named queries, migrations, the embedded server."""
