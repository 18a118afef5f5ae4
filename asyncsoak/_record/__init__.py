"""Recording.

Events, the event sink, the serializer and the journal's format, the artifact builder, bounded
series, recovery, the runtime snapshot.
"""
