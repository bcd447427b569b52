from django.db import migrations, models


def first_line(text, limit):
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def backfill_tasks(apps, schema_editor):
    Run = apps.get_model("delegation", "Run")
    for run in Run.objects.exclude(request=None).only("pk", "request").iterator():
        message = (run.request or {}).get("message")
        if isinstance(message, str):
            task = first_line(message, 200)
            if task:
                Run.objects.filter(pk=run.pk).update(task=task)


class Migration(migrations.Migration):
    dependencies = [("delegation", "0007_api_token_expiry_scope")]

    operations = [
        migrations.AddField(
            model_name="run", name="task", field=models.CharField(blank=True, max_length=200)
        ),
        migrations.AddField(
            model_name="run", name="activity", field=models.CharField(blank=True, max_length=200)
        ),
        migrations.AddField(
            model_name="run", name="activity_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.RunPython(backfill_tasks, migrations.RunPython.noop),
    ]
