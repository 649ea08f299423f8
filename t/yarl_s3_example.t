#!/usr/bin/perl

# The example configuration nginx-conf/s3.conf runs as shipped (ports, paths and the sync
# interval swapped for free ports and 200 ms) in front of the S3 application it is written
# for (examples/s3-app): bucket from the host or the path, type from the method, nginx
# checks the bucket quotas, the application accounts its handlers' quotas (children of
# the bucket quotas), nginx charges each GET's bytes to the bucket's bandwidth quota after
# the response (yarl_charge $bytes_sent), and the JSON access log carries $yarl_status.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get http_request status_of header_of);
use JSON::PP ();

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('s3_photos', 1000, 1000, 1000);
$t->put_quota('s3_photos_read', 0.01, 3, 3, 's3_photos');
$t->put_quota('s3_photos_get', 1000, 1000, 1000, 's3_photos_read');
# Bandwidth of GETs from "videos": 2,000 bytes, draining 1 byte/s.
$t->put_quota('s3_videos_bytes_out', 1, 2000, 2000);
$t->run_app(8081, 'A');

open my $fh, '<', "$FindBin::Bin/../nginx-conf/s3.conf" or die "s3.conf: $!\n";
my $conf = do { local $/; <$fh> };
close $fh;
my $root = $t->root_url('A');
$conf =~ s{load_module \S+;}{load_module $ENV{TEST_YARL_MODULE};};
$conf =~ s{yarl_roots http://127\.0\.0\.1:7700;}{yarl_roots $root;} or die "no yarl_roots\n";
$conf =~ s{yarl_sync_interval 1s;}{yarl_sync_interval 200ms;} or die "no yarl_sync_interval\n";
for my $p (8080, 8081) {
	my $free = $t->port($p);
	$conf =~ s/127\.0\.0\.1:$p\b/127.0.0.1:$free/g;
}
$conf =~ s{^pid .*$}{pid %%TESTDIR%%/nginx.pid;}m;
$conf =~ s{^error_log .*$}{error_log %%TESTDIR%%/error.log notice;\nuser root;}m if $> == 0;
$conf =~ s{^error_log .*$}{error_log %%TESTDIR%%/error.log notice;}m if $> != 0;
$t->write_file_expand('nginx.conf', $conf);

my ($rc, $out) = $t->test_config();
is($rc, 0, 'nginx -t accepts the example') or diag($out);
$t->run($t->port(8080));
my $p = $t->port(8080);
my $app = $t->port(8081);
ok($t->wait_for(sub {
	($t->stats($p, '/yarl/stats?quota=s3_photos_read')->{quota} // {})->{parent}
		&& ($t->stats($p, "/_yarl/status?quota=s3_photos_get")->{quota} // {})->{parent}
}, 10), 'quotas arrived at nginx and at the application (through nginx, /_yarl/)');

my %s3 = (Host => 's3.example.net');
my $r = http_request('PUT', $p, '/photos', \%s3, '');
is(status_of($r), 200, 'bucket created (path style)');
is(header_of($r, 'X-Yarl-Status'), 'UNLIMITED', 'writes have no quota: UNLIMITED');
is(status_of(http_request('PUT', $p, '/photos/cat.jpg', \%s3, 'meow')), 200, 'object stored');

# The application accounts s3_photos_get, whose parent s3_photos_read lets 3 units pass.
my @s = map {
	status_of(http_get($p, '/cat.jpg', Host => 'photos.s3.example.net'))
} 1 .. 4;
is_deeply(\@s, [(200) x 4], 'reads pass up to the read quota (virtual-host style)');
$r = http_get($p, '/photos/cat.jpg', %s3);
is(status_of($r), 429, 'read rejected over the quota (path style), 429 ...');
is(header_of($r, 'X-Yarl-Status'), 'PASSED', '... by the application: nginx did not know yet');
like($r, qr/SlowDown/, 'with the application\'s error body');
# nginx learns the application's counts through the root.
ok($t->wait_for(sub {
	$r = http_get($p, '/photos/cat.jpg', %s3);
	(header_of($r, 'X-Yarl-Status') // '') eq 'REJECTED';
}, 5), 'then nginx rejects the bucket\'s reads itself');
is(status_of($r), 429, 'with 429');
is(header_of($r, 'RateLimit-Policy'), '"s3_photos_read";q=4;w=400',
	'RateLimit-Policy: the chain up to the rejecting quota');
is(header_of($r, 'RateLimit'), '"s3_photos_read";r=0;t=' . header_of($r, 'Retry-After'),
	'RateLimit: nothing left, t = Retry-After');

# GETs of "videos" are charged by nginx, after each answer, the bytes it sent (a 1,000-byte
# body and the headers): two answers fill the 2,000 bytes, nginx itself refuses the third.
is(status_of(http_request('PUT', $p, '/videos', \%s3, '')), 200, 'bucket videos');
is(status_of(http_request('PUT', $p, '/videos/clip.mp4', \%s3, 'v' x 1000)), 200, 'a clip');
ok($t->wait_for(sub {
	($t->stats($p, '/yarl/stats?quota=s3_videos_bytes_out')->{quota} // {})->{limit}
}, 5), 'bandwidth quota arrived');
my @v = map {
	my $r = http_get($p, '/videos/clip.mp4', %s3);
	status_of($r) . ' ' . (header_of($r, 'X-Yarl-Status') // '');
} 1 .. 3;
is_deeply(\@v, ['200 PASSED', '200 PASSED', '429 REJECTED'],
	'the bandwidth quota refuses the third GET, in nginx, without waiting for a sync');
my $bw_fill = $t->stats($p, '/yarl/stats?quota=s3_videos_bytes_out')->{quota}{fill};
$t->finish();

my @log = map { JSON::PP->new->decode($_) } grep { /\S/ } split /\n/, $t->read_file('logs/access.json');
my ($rej) = grep { $_->{yarl_status} eq 'REJECTED' } @log;
ok($rej, 'JSON access log has the rejection');
is($rej && $rej->{yarl_quota}, 's3_photos_read', 'JSON log names the quota');
is($rej && $rej->{bucket}, 'photos', 'bucket from the path');
is((grep { $_->{method} eq 'PUT' } @log)[0]{type}, 'write', 'PUT is a write');
my ($bw) = grep { $_->{yarl_status} eq 'REJECTED' && $_->{bucket} eq 'videos' } @log;
is($bw && $bw->{yarl_quota}, 's3_videos_bytes_out', 'the bandwidth rejection names its quota');
my @gets = grep { $_->{bucket} eq 'videos' && $_->{method} eq 'GET' } @log;
my $sent = 0;
$sent += $_->{bytes_sent} for @gets;
is(scalar @gets, 3, 'three GETs of videos logged');
cmp_ok($gets[0]{bytes_sent}, '>', 1000, 'an answer\'s $bytes_sent counts body and headers');
# The quota drains 1 byte/s: the fill read after the third GET is what the three answers
# sent (the refusal's bytes too), less the few bytes drained since the first.
cmp_ok(abs($bw_fill - $sent), '<=', 10, "fill $bw_fill = the \$bytes_sent of the three answers, $sent");
done_testing();
